"""Hangs, stragglers and DoNotRetry end to end on the real control plane: real torchrun and
trainer pods on the kubelets' Nodes, the helm-installed operator reading the nodes' heartbeats
from the progress endpoint every second.

The faults come from the example's test flags on node 1 only (``--fault-node 1``):
``--hang-at-step`` blocks its worker forever after that step (once per snapshot directory),
``--slow-seconds`` makes every step of it slower, ``--do-not-retry-at-step`` raises DoNotRetry.
Each scenario prints the latency it measured. Their fast twins, in the default suite, are the
pure policy tests (tests/operator/decide/test_hang.py, test_straggler.py) and the heartbeat
tests with a real store (tests/trainer/test_heartbeats.py).
"""
from __future__ import annotations

import time

import pytest

from ddpjob_operator.api import constants as C
from ddpjob_sandbox.examples import trainer_args
from ddpjob_sandbox.metrics import is_event
from ddpjob_sandbox.readers import condition, wait_for_event
from tests.cluster.sandbox.scenarios import TEST_SECONDS, Sandbox

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(TEST_SECONDS)]

START_TIMEOUT = 120  # operator + 2 torchrun agents + 2 workers importing torch on 2 shared cores
POLL_SECONDS = 1  # --progress-poll-seconds of these tests
HANG_TIMEOUT = 10
HANG_AT, SNAPSHOT_EVERY = 20, 10


@pytest.mark.slow  # ~90 s: two generations of pods importing torch, and the hang timeout
@pytest.mark.operator_args("--progress-poll-seconds", str(POLL_SECONDS))
def test_a_worker_that_blocks_forever_restarts_the_group_from_the_last_snapshot(sandbox: Sandbox):
    k8s, nodes, job = sandbox.kube, sandbox.nodes, sandbox.job

    def policy(spec: dict) -> None:
        # The collective timeout outlasts the test: only the operator's hang detection can act.
        spec["failurePolicy"].update(hangTimeoutSeconds=HANG_TIMEOUT, collectiveTimeoutSeconds=600)

    args = trainer_args(epochs=1, samples=2048, step_sleep=0.05, snapshot_every_steps=SNAPSHOT_EVERY,
                        extra=("--fault-node", "1", "--hang-at-step", str(HANG_AT)))
    progress, body = sandbox.start_job(args=args, edit=policy)
    progress.wait(is_event("step", step=HANG_AT), START_TIMEOUT, "the step node 1 hangs after")
    marker = progress.metrics_path.parent  # the job's own directory of its claim
    hung_at = float((marker / "hang-injected").read_text().split()[0])

    hang = wait_for_event(k8s, C.REASON_HANG, HANG_TIMEOUT + 30, job)
    detected = time.time() - hung_at
    resumed = progress.wait(is_event("start", resume_step=SNAPSHOT_EVERY), START_TIMEOUT, "the new group's start")
    first = progress.wait(is_event("step", step=SNAPSHOT_EVERY + 1), 60, "the new group's first step")
    restarted = time.time() - hung_at
    status = progress.wait_phase(C.PHASE_SUCCEEDED, 120)

    assert hang[0] == C.EVENT_WARNING, hang
    assert f"stuck at step {HANG_AT}, progress stopped on node(s) 1;" in hang[2], hang[2]
    assert f"from the last snapshot (step {SNAPSHOT_EVERY})" in hang[2], hang[2]
    failure = next(f for f in status["failures"] if f["cause"] == C.CAUSE_HANG)
    assert (failure["step"], failure["stalledNodes"], failure["pod"]) == (HANG_AT, ["1"], f"{job}-node-1"), failure
    assert status["rendezvousGeneration"] == 1 and status["restarts"] == 1, status
    assert status["restartsWithProgress"] == 1, "a snapshot newer than at the start: the hang is free"
    assert resumed["world_size"] == 2 and first is not None
    # The step stood still from the hang on; the operator saw that within one poll of the timeout
    # (status times have whole seconds, so its clock may start up to 1 s before the hang).
    assert HANG_TIMEOUT - 1 <= detected <= HANG_TIMEOUT + POLL_SECONDS + 5, detected
    print(f"hang latency: injected -> Hang Event {detected:.1f} s (timeout {HANG_TIMEOUT} s, poll {POLL_SECONDS} s); "
          f"injected -> first step of the restarted group {restarted:.1f} s")


@pytest.mark.slow  # ~60 s: pods importing torch, the straggler window, a replacement
@pytest.mark.operator_args("--progress-poll-seconds", str(POLL_SECONDS), "--status-write-interval-seconds", "2")
def test_a_slow_node_is_reported_and_replaced_under_replace(sandbox: Sandbox):
    k8s, nodes, job = sandbox.kube, sandbox.nodes, sandbox.job
    window = 5

    def policy(spec: dict) -> None:
        spec["stragglerPolicy"] = {"action": "Replace", "threshold": 1.5, "windowSeconds": window}

    args = trainer_args(epochs=3, samples=4096, step_sleep=0.02, snapshot_every_steps=20,
                        extra=("--fault-node", "1", "--slow-seconds", "0.2"))
    progress, _ = sandbox.start_job(args=args, edit=policy)
    progress.wait(is_event("step", step=1), START_TIMEOUT, "the first step")
    slow_from = time.time()
    seen = k8s.wait_for(lambda: (p := progress.status().get("progress") or {}).get("slowestNode") == "1" and p,
                        timeout=30, interval=0.2, what="status.progress naming node 1")
    reported = time.time() - slow_from
    old = nodes.current(f"{job}-node-1").uid
    replaced = wait_for_event(k8s, C.REASON_STRAGGLER_REPLACED, window + 30, job)
    detected = time.time() - slow_from
    nodes.wait_for_container(f"{job}-node-1", 60, other_than=old)

    assert seen["slowdown"] >= 1.5, seen
    assert replaced[2].startswith(f"node 1 (pod {job}-node-1) has slowed the group "), replaced
    status = progress.status()
    failure = next(f for f in status["failures"] if f["cause"] == C.CAUSE_STRAGGLER)
    assert (failure["pod"], failure["index"]) == (f"{job}-node-1", 1), failure
    assert status.get("restarts", 0) == 0, "a straggler's replacement is not charged"
    print(f"straggler latency: first slow step -> status.progress names it {reported:.1f} s, -> replaced "
          f"{detected:.1f} s (window {window} s, poll {POLL_SECONDS} s, slowdown {seen['slowdown']}x)")


@pytest.mark.slow  # ~40 s: pods importing torch
def test_do_not_retry_fails_the_job_at_once_without_torchrun_restarting_the_workers(sandbox: Sandbox):
    k8s, nodes, job = sandbox.kube, sandbox.nodes, sandbox.job

    def policy(spec: dict) -> None:
        spec["elasticPolicy"]["maxRestarts"] = 3  # torchrun would restart the workers 3 times first

    args = trainer_args(epochs=1, samples=2048, step_sleep=0.05, snapshot_every_steps=10,
                        extra=("--fault-node", "1", "--do-not-retry-at-step", "5"))
    progress, _ = sandbox.start_job(args=args, edit=policy)
    progress.wait(is_event("step", step=5), START_TIMEOUT, "the step node 1 gives up after")
    raised = time.time()
    status = progress.wait_phase(C.PHASE_FAILED, 60)
    took = time.time() - raised

    failed = condition(k8s, C.COND_FAILED, job)
    assert failed["reason"] == "InjectedFault", failed
    assert "do_not_retry_at_step=5: giving up on purpose" in failed["message"], failed
    assert wait_for_event(k8s, "InjectedFault", 10, job) == (C.EVENT_WARNING, "InjectedFault", failed["message"])
    assert status.get("restarts", 0) == 0, status
    starts = [e for e in progress.events() if e["event"] == "start"]
    assert len(starts) == 1, f"torchrun restarted the workers: {starts}"
    print(f"DoNotRetry latency: raised -> job Failed {took:.1f} s")
