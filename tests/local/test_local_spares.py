"""Warm spares under `ddpjob run` (spec.elasticPolicy.spareReplicas): the roles in the view and the
timeline (pure), and end to end a spare that takes a killed node's place with one pause and no
backoff, ending with an uninterrupted run's weights."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ddpjob_operator.api.validation import parse_job
from ddpjob_operator.local.plan import local_plan
from ddpjob_operator.local.state import RUNNING, SPARE, STARTING, RunState, apply_metric, apply_node_event
from ddpjob_operator.local.timeline import build_timeline
from ddpjob_trainer.snapshots.store import SnapshotStore
from ddpjob_sandbox.examples import load_example, write_manifest
from ddpjob_sandbox.metrics import read_events
from tests.support.elastic_checks import assert_ran_exactly_once

DDPJOB = Path(sys.executable).parent / "ddpjob"
EPOCHS = 6
# The fast tier after every step: a SIGKILL loses at most the step in flight.
ARGS = ["--epochs", str(EPOCHS), "--samples", "2048", "--batch-size", "32", "--snapshot-every-epochs", "1",
        "--snapshot-every-steps", "10", "--fast-snapshot-every-steps", "1", "--step-sleep", "0.03"]
BACKOFF = 60  # seconds: a replacement that waited for it would be seen (the run takes less)
RUN_TIMEOUT = 400
SPARE_READY = "waiting outside the group as a spare"  # what a spare's agent says (rendezvous/early.py)


def spare_job(tmp_path: Path, spares: int = 1) -> dict:
    """The example as a fixed-size 2-node job (a spare needs replicas == maxReplicas) with spares."""
    job = load_example()
    spec = job["spec"]
    spec["args"] = ARGS
    spec["elasticPolicy"].update({"maxReplicas": 2, "spareReplicas": spares})
    spec["failurePolicy"]["backoffSeconds"] = BACKOFF
    return job


def test_the_plan_starts_the_spares_after_the_replicas_and_says_so(tmp_path):
    ref, spec = parse_job(spare_job(tmp_path, spares=2))
    plan = local_plan(ref.name, spec, rdzv_id="r", run_dir=tmp_path, torchrun="torchrun", port=1)
    assert (plan.replicas, plan.spares, len(plan.nodes)) == (2, [2, 3], 4)
    assert any("2 warm spare node(s) (nodes 2-3)" in note for note in plan.notes), plan.notes


def test_a_promotion_swaps_the_roles_in_the_view():
    state = RunState.new("mlp", 2, max_incidents=5, spares=1)
    for node, spare in ((0, False), (1, False), (2, True)):
        apply_node_event(state, {"event": "started", "node": node, "pid": 10 + node, "spare": spare})
    apply_metric(state, {"event": "step", "step": 1, "world_size": 2})
    assert [state.nodes[i].state for i in range(3)] == [RUNNING, RUNNING, SPARE]

    apply_node_event(state, {"event": "exited", "node": 1, "code": 137, "action": "replace", "message": "m"})
    line = apply_node_event(state, {"event": "promoted", "node": 2, "replaces": 1,
                                    "message": "spare node 2 joins the group in node 1's place"})
    assert line == "spare node 2 joins the group in node 1's place"
    assert (state.nodes[2].state, state.nodes[2].spare, state.nodes[1].spare) == (STARTING, False, True)
    line = apply_node_event(state, {"event": "started", "node": 1, "pid": 20, "spare": True})
    assert line == "node 1 started (pid 20) as a replacement, a warm spare"
    apply_metric(state, {"event": "step", "step": 2, "world_size": 2})
    assert [state.nodes[i].state for i in range(3)] == [RUNNING, SPARE, RUNNING]


def test_the_timeline_marks_promotions_and_counts_the_waiting_spares():
    events = [{"event": "started", "node": 0, "t": 0.0, "time": "2026-01-01T00:00:00Z"},
              {"event": "started", "node": 1, "t": 0.1, "time": "2026-01-01T00:00:00.1Z", "spare": True},
              {"event": "exited", "node": 0, "t": 5.0, "code": 137},
              {"event": "promoted", "node": 1, "replaces": 0, "t": 5.0},
              {"event": "started", "node": 0, "t": 5.2, "spare": True}]
    timeline = build_timeline("mlp", events, [])
    assert [(m.t, m.label) for m in timeline.promotions] == [(5.0, "spare node 1 for node 0")]
    assert timeline.spares_running == [(0.0, 0), (0.1, 1), (5.0, 0), (5.2, 1)]
    assert timeline.nodes_running[-1] == (5.2, 2)


def run_job(job: dict, workdir: Path, kill_node_when_spare_ready: int | None = None) -> tuple[Path, str]:
    """`ddpjob run` of `job`; with kill_node_when_spare_ready, that node's whole agent group is
    SIGKILLed (as its machine dying) once the group trains (a step in the metrics) and the spare's
    agent says it waits outside the group."""
    run_dir = workdir / "run"
    manifest = write_manifest(job, workdir / "job.yaml")
    argv = [str(DDPJOB), "run", str(manifest), "--workdir", str(run_dir), "--port", "0", "--plain"]
    with open(workdir / "ddpjob.out", "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        if kill_node_when_spare_ready is not None:
            spare_log, metrics = run_dir / "logs" / "node-2.log", run_dir / "snapshots" / "metrics.jsonl"
            deadline = time.monotonic() + RUN_TIMEOUT
            while not (spare_log.exists() and SPARE_READY in spare_log.read_text(errors="replace")
                       and any(e["event"] == "step" for e in read_events(metrics))):
                assert proc.poll() is None and time.monotonic() < deadline, (workdir / "ddpjob.out").read_text()
                time.sleep(0.2)
            victim = next(e for e in events(run_dir) if e["event"] == "started" and e["node"] == kill_node_when_spare_ready)
            os.killpg(victim["pid"], signal.SIGKILL)
        code = proc.wait(timeout=RUN_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)
    out = (workdir / "ddpjob.out").read_text()
    assert code == 0, out
    return run_dir, out


def events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line.strip()]


def final_model(run_dir: Path) -> dict:
    latest = SnapshotStore(str(run_dir / "snapshots")).latest()
    return torch.load(latest.path, weights_only=False)["model"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    run_dir, _ = run_job(spare_job(tmp_path_factory.mktemp("uninterrupted"), spares=0),
                         tmp_path_factory.mktemp("uninterrupted-run"))
    return final_model(run_dir)


@pytest.fixture(scope="module")
def spared_run(tmp_path_factory):
    """The job with one warm spare, node 1 SIGKILLed mid-training: (run dir, ddpjob's output)."""
    return run_job(spare_job(tmp_path_factory.mktemp("spared")), tmp_path_factory.mktemp("spared-run"),
                   kill_node_when_spare_ready=1)


@pytest.mark.slow  # two runs of two nodes (and a spare): ~90 s alone, minutes on a loaded machine
def test_a_spare_takes_a_killed_nodes_place_with_one_pause_and_the_uninterrupted_weights(spared_run, uninterrupted):
    run_dir, out = spared_run
    log = events(run_dir)
    exited = next(e for e in log if e["event"] == "exited" and e["node"] == 1)
    assert exited["code"] == 137 and exited["action"] == "replace"
    assert [(e["node"], e["replaces"]) for e in log if e["event"] == "promoted"] == [(2, 1)], out

    # One pause: the survivors' next group is at full size with the spare; no round at reduced size.
    metrics = run_dir / "snapshots" / "metrics.jsonl"
    starts = [e for e in read_events(metrics) if e["event"] == "start"]
    assert [e["world_size"] for e in starts] == [2, 2], starts
    assert starts[1]["resume_step"], "the group resumed from the fast tier or a snapshot, not from step 0"
    assert_ran_exactly_once(metrics, EPOCHS)
    model = final_model(run_dir)
    assert model.keys() == uninterrupted.keys()
    for name, tensor in uninterrupted.items():
        torch.testing.assert_close(model[name], tensor, rtol=0, atol=0, msg=name)


@pytest.mark.slow
def test_a_node_killed_by_hand_is_a_crash_incident_whose_replacement_spare_starts_at_once_the_first_time(spared_run):
    """A SIGKILLed agent exits 137, as the OOM killer's victim does: `ddpjob run` cannot tell it from a
    job-caused exit, so it is a failure incident of the restart budget. The job's first incident is no
    crash loop: the lost node's replacement (the new spare) starts at once, well inside BACKOFF; a
    crash loop backs off from its second incident in a row, spares or not
    (tests/local/test_local_policy.py, tests/operator/decide/test_spares.py). Training does not wait
    either way: the spare has joined (the test above)."""
    run_dir, out = spared_run
    log = events(run_dir)
    exited = next(e for e in log if e["event"] == "exited" and e["node"] == 1)
    assert exited["code"] == 137 and exited["action"] == "replace", exited
    assert exited["replace_at"] - exited["t"] < 1, exited
    assert "; replacing it now" in exited["message"], exited
    promoted = [e for e in log if e["event"] == "promoted"]
    assert [(e["node"], e["replaces"]) for e in promoted] == [(2, 1)], promoted
    new_spare = next(e for e in log if e["event"] == "started" and e["node"] == 1 and e["start"] == 2)
    assert new_spare["t"] - exited["t"] < BACKOFF / 2, (exited, new_spare)
    assert "1 failure incident(s) recovered from" in out, out[-2000:]
