"""One pause per node loss without spares (spec.elasticPolicy.replacementWaitSeconds) under `ddpjob
run`: the kill given as the node's machine lost (--node-lost) starts the replacement at once, and the
survivor holds its round open for it instead of training alone and restarting again when it joins."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ddpjob_sandbox.examples import load_example, write_manifest
from ddpjob_sandbox.metrics import read_events
from tests.local.test_local_spares import ARGS, EPOCHS, final_model, uninterrupted  # noqa: F401 (a fixture)
from tests.support.elastic_checks import assert_ran_exactly_once

DDPJOB = Path(sys.executable).parent / "ddpjob"
BACKOFF = 60  # seconds: a replacement that waited for it would be seen (the run takes less)
# The bound on the survivor's wait: far above a replacement's start here (a few seconds; tens of
# seconds on a loaded machine), so the test sees the rule, not the machine's speed.
WAIT = 180
RUN_TIMEOUT = 400
WAITING = "waits up to 180 s for its replacement"  # the survivor's agent (rendezvous/early.py say_waiting)
JOINED = "the replacement joined"  # ... and how the wait ended


def waiting_job() -> dict:
    """The example (elastic 1..4, 2 nodes) with the test's training, a backoff a run would show,
    and the survivors' wait for a replacement."""
    job = load_example()
    spec = job["spec"]
    spec["args"] = ARGS
    spec["elasticPolicy"]["replacementWaitSeconds"] = WAIT
    spec["failurePolicy"]["backoffSeconds"] = BACKOFF
    return job


def events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def lost_run(tmp_path_factory):
    """`ddpjob run` of the waiting job, node 1 SIGKILLed 3 s after the first step as its machine lost."""
    workdir = tmp_path_factory.mktemp("one-pause")
    run_dir = workdir / "run"
    argv = [str(DDPJOB), "run", str(write_manifest(waiting_job(), workdir / "job.yaml")), "--workdir", str(run_dir),
            "--port", "0", "--plain", "--kill-node-after", "3", "--node-lost"]
    done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=RUN_TIMEOUT, text=True)
    assert done.returncode == 0, done.stdout
    return run_dir, done.stdout


@pytest.mark.slow  # two runs of two nodes: ~90 s alone, minutes on a loaded machine
def test_a_lost_node_costs_one_pause_every_step_trains_once_and_the_weights_are_the_uninterrupted_ones(
        lost_run, uninterrupted):  # noqa: F811 (the imported fixture)
    run_dir, out = lost_run
    log = events(run_dir)
    exited = next(e for e in log if e["event"] == "exited" and e["node"] == 1)
    assert (exited["code"], exited["action"]) == (137, "replace"), exited
    assert "disruptions do not use the restart budget" in exited["message"], exited
    replacement = next(e for e in log if e["event"] == "started" and e["node"] == 1 and e["start"] == 2)
    assert replacement["t"] - exited["t"] < BACKOFF / 2, "the replacement waited for the backoff"
    assert not [e for e in log if e["event"] == "held"], "the runner held the replacement back"

    survivor_log = (run_dir / "logs" / "node-0.log").read_text(errors="replace")
    assert WAITING in survivor_log and JOINED in survivor_log, survivor_log[-3000:]

    # One pause: after the kill, one trainer start, at full size; no step at world size 1.
    metrics = run_dir / "snapshots" / "metrics.jsonl"
    raw = read_events(metrics)
    assert [e["world_size"] for e in raw if e["event"] == "start"] == [2, 2], out
    assert not [e for e in raw if e["event"] == "step" and e["world_size"] != 2]
    assert_ran_exactly_once(metrics, EPOCHS)
    model = final_model(run_dir)
    assert model.keys() == uninterrupted.keys()
    for name, tensor in uninterrupted.items():
        torch.testing.assert_close(model[name], tensor, rtol=0, atol=0, msg=name)
