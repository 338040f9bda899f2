"""`ddpjob run` listens on loopback only: during a real run of the example job, every listening
TCP socket of the run's processes (the rendezvous store, each agent's liveness beacon and node
0's c10d store, the workers' process-group store and gloo) is on 127.0.0.1 or ::1, so no other
machine can reach the pickled rendezvous state every agent unpickles (docs/security.md).

The one exception ddpjob cannot choose: a script that calls torch.distributed.init_process_group
itself has rank 0's process-group store (MASTER_PORT) listen on every interface (torch's
TCPStore); `ddpjob run` says so, and the plain-script case pins that nothing else is exposed.
"""
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from ddpjob_operator import cli
from ddpjob_operator.render.store_pod import STORE_PROGRAM
from ddpjob_sandbox.examples import load_example, write_manifest
from tests.support.listeners import Listener, descendants, listeners

SCRIPTS = Path(__file__).resolve().parents[1] / "byo_scripts"
STORE_PROGRAM_LINE = STORE_PROGRAM.splitlines()[0]  # the store's `python -c` program names itself first


class Sampler:
    """Lists the listening sockets of this process's descendants every 0.1 s while a run goes on."""

    def __init__(self):
        self.seen: dict[tuple[int, str, int], Listener] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *_):
        self._stop.set()
        self._thread.join()

    def _run(self):
        me = os.getpid()
        while not self._stop.wait(0.1):
            for found in listeners(descendants(me) - {me}):
                self.seen.setdefault((found.pid, found.address, found.port), found)


def example_job(tmp_path, rdzv_store):
    job = load_example()
    spec = job["spec"]
    spec["args"] = ["--epochs", "2", "--samples", "1024", "--batch-size", "32", "--snapshot-every-epochs", "1",
                    "--step-sleep", "0.05"]
    spec["elasticPolicy"]["rdzvStore"] = rdzv_store
    return str(write_manifest(job, tmp_path / "job.yaml"))


def plain_script_job(tmp_path):
    job = load_example()
    job["metadata"]["name"] = "tut"
    spec = job["spec"]
    del spec["module"]
    spec.update(script=str(SCRIPTS / "tutorial_multinode.py"), args=["6", "1"],
                env=[{"name": "TUTORIAL_STEP_SLEEP", "value": "0.05"}])
    return str(write_manifest(job, tmp_path / "job.yaml"))


def run_and_sample(job_file, run_dir, capsys):
    with Sampler() as sampler:
        code = cli.main(["run", job_file, "--workdir", str(run_dir), "--port", "0", "--plain"])
    out = capsys.readouterr().out
    assert code == 0, out
    return list(sampler.seen.values()), out


def kinds(found):
    """Which of ddpjob's processes held listeners (a name per listener)."""
    def kind(listener):
        if STORE_PROGRAM_LINE in listener.command:
            return "store"
        if "torchrun" in listener.command:
            return "agent"
        return "worker"
    return sorted(kind(listener) for listener in found)


@pytest.mark.parametrize("rdzv_store", ["pod", "node"])
def test_every_listener_of_a_local_run_is_on_loopback(tmp_path, capsys, rdzv_store):
    found, _ = run_and_sample(example_job(tmp_path, rdzv_store), tmp_path / "run", capsys)
    exposed = [listener for listener in found if not listener.on_loopback]
    assert not exposed, "\n".join(f"{s.address}:{s.port} pid {s.pid}: {s.command}" for s in exposed)
    seen = kinds(found)
    # Both agents' beacons; the store (its own process, or node 0's agent); rank 0's worker store and gloo.
    assert seen.count("agent") == (2 if rdzv_store == "pod" else 3), seen
    assert seen.count("store") == (1 if rdzv_store == "pod" else 0), seen
    assert seen.count("worker") >= 2, seen


def test_a_plain_torch_script_exposes_only_the_process_group_store_torch_opens_and_the_run_says_so(
        tmp_path, capsys):
    found, out = run_and_sample(plain_script_job(tmp_path), tmp_path / "run", capsys)
    exposed = [listener for listener in found if not listener.on_loopback]
    assert len(exposed) == 1 and kinds(exposed) == ["worker"], exposed
    assert "tutorial_multinode.py" in exposed[0].command
    assert "note: a script that calls torch.distributed.init_process_group itself" in out
