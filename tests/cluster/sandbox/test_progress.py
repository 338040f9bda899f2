"""Progress-aware recovery end to end on the real control plane: real torchrun and trainer pods
on the kubelets' Nodes, which report termination messages; the helm-installed operator reads
them, and the snapshots the running pods serve on their progress port."""
from __future__ import annotations

import time

import pytest

from ddpjob_operator.api import constants as C
from ddpjob_trainer.report.record import POLL_SECONDS
from ddpjob_sandbox.metrics import is_event
from ddpjob_sandbox.examples import trainer_args
from tests.cluster.sandbox.scenarios import TEST_SECONDS, Sandbox

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(TEST_SECONDS)]

START_TIMEOUT = 120  # operator + 2 torchrun agents + 2 workers importing torch on 2 shared cores


@pytest.mark.slow  # ~80 s of real training on two shared cores
def test_a_failure_after_a_new_snapshot_costs_no_restart_and_status_learns_progress(sandbox: Sandbox):
    k8s, nodes, job = sandbox.kube, sandbox.nodes, sandbox.job
    body = sandbox.body(trainer_args(epochs=3, samples=2048, step_sleep=0.1, snapshot_every_steps=10),
                        rdzv_store=None)
    body["spec"]["failurePolicy"]["maxRestarts"] = 0  # without progress the first failure would end the job
    progress = sandbox.apply(body)
    progress.wait(is_event("start", world_size=2), START_TIMEOUT, "both nodes training")
    progress.wait(is_event("snapshot", step=lambda s: s >= 10), 60, "a snapshot")
    time.sleep(POLL_SECONDS + 2)  # node 1 copies progress.json from the shared claim at most this often
    killed = nodes.kill(f"{job}-node-1")
    nodes.wait_for_container(f"{job}-node-1", 60, other_than=killed.uid)
    status = progress.wait_phase(C.PHASE_SUCCEEDED, 180)

    snapshots = [e for e in progress.events() if e["event"] == "snapshot"]
    assert (status["restarts"], status["restartsWithProgress"]) == (1, 1), status
    assert status["lastSnapshot"]["step"] == snapshots[-1]["step"] and status["lastSnapshot"]["path"].endswith(
        snapshots[-1]["path"].rsplit("/", 1)[-1])
    failure = status["failures"][0]
    assert (failure["pod"], failure["cause"], failure["exitCode"]) == (f"{job}-node-1", "Error", 137)
    recovery = status["recovery"]
    assert 0 < recovery["lastRecoverySeconds"] < 120 and recovery["lostSeconds"] > 0
    print(f"time to recover {recovery['lastRecoverySeconds']:.1f} s, lost {recovery['lostSeconds']:.1f} s")


@pytest.mark.slow  # ~50 s of real training on two shared cores
@pytest.mark.operator_args("--progress-poll-seconds", "1", "--status-write-interval-seconds", "2")
def test_the_status_follows_the_snapshots_of_a_job_that_never_fails(sandbox: Sandbox):
    k8s, nodes, job = sandbox.kube, sandbox.nodes, sandbox.job
    progress = sandbox.start_job(args=trainer_args(epochs=3, samples=2048, step_sleep=0.1, snapshot_every_steps=10),
                                 rdzv_store=None)[0]
    progress.wait(is_event("start", world_size=2), START_TIMEOUT, "both nodes training")
    first = progress.wait(is_event("snapshot", step=lambda s: s >= 20), 60, "a second snapshot")
    # No container has exited: only the progress endpoint can tell the operator this.
    seen = k8s.wait_for(lambda: (s := progress.status()).get("lastSnapshot", {}).get("step", 0) >= first["step"] and s,
                        timeout=20, what="status.lastSnapshot from the running pods")
    assert all(nodes.current(name).poll() is None for name in (f"{job}-node-0", f"{job}-node-1")), "a container exited"
    assert seen["phase"] == C.PHASE_RUNNING and seen["restarts"] == 0
    later = seen["lastSnapshot"]["step"] + 20
    progress.wait(is_event("snapshot", step=lambda s: s >= later), 60, "a later snapshot")
    k8s.wait_for(lambda: progress.status().get("lastSnapshot", {}).get("step", 0) >= later, timeout=20,
                 what="the later snapshot, polled")
    progress.wait_phase(C.PHASE_SUCCEEDED, 180)
