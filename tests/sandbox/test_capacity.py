"""Capacity-driven elasticity end to end in the sandbox: one node pod cannot be scheduled, the
job trains at minReplicas with the real operator, real torchrun and real training, says why
in its status, and grows when the capacity arrives.

The sandbox node plays a scheduler without capacity for ``mlp-node-1``
(NodeAgent.hold_unscheduled: Pending, PodScheduled False, reason Unschedulable, kube-scheduler's
message) until the test releases it. Test-speed overrides as in tests/sandbox/test_c10d.py
(see ddpjob_sandbox.examples.example_job); rdzvStore ``node``.
"""
from __future__ import annotations

import pytest

from ddpjob_operator.api import constants as C
from tests.support.elastic_checks import assert_ran_exactly_once, assert_resumed_from_snapshots, world_size_phases
from ddpjob_sandbox.readers import condition, events
from ddpjob_sandbox.pod_status import INSUFFICIENT_GPU
from tests.sandbox.scenarios import start_job
from ddpjob_sandbox.examples import trainer_args
from ddpjob_sandbox.metrics import is_event

START_TIMEOUT = 120  # operator + a torchrun agent + a worker importing torch on 2 shared cores
HELD = "mlp-node-1"


@pytest.mark.slow  # ~35-40 s alone, more on a loaded machine: real training on two shared cores
def test_an_unschedulable_node_lets_training_start_at_min_replicas_and_joins_when_scheduled(
        k8s, operator, node_agent, tmp_path):
    epochs, pending_timeout = 2, 3

    def policy(spec: dict) -> None:
        spec["replicas"] = 2
        spec["elasticPolicy"]["minReplicas"] = 1
        spec["scheduling"] = {**(spec.get("scheduling") or {}), "pendingTimeoutSeconds": pending_timeout}

    node_agent.hold_unscheduled(HELD)
    args = trainer_args(epochs=epochs, samples=2048, step_sleep=0.1, snapshot_every_steps=10)
    progress, _ = start_job(k8s, node_agent, tmp_path, args=args, edit=policy)
    progress.wait(is_event("start", world_size=1), START_TIMEOUT, "node 0 training alone")
    progress.wait(is_event("snapshot", step=lambda s: s >= 10), 60, "a snapshot at world size 1")

    unschedulable = k8s.wait_for(lambda: (c := condition(k8s, C.COND_NODES_UNSCHEDULABLE)) and c["status"] == "True"
                                 and c, timeout=30, what="condition NodesUnschedulable True")
    assert unschedulable["reason"] == C.REASON_UNSCHEDULABLE
    message = unschedulable["message"]
    assert f"pendingTimeoutSeconds ({pending_timeout}s)" in message and "training continues on 1 node(s)" in message
    assert f"{HELD}: Unschedulable: {INSUFFICIENT_GPU}" in message, message
    assert (C.EVENT_WARNING, C.REASON_UNSCHEDULABLE, message) in events(k8s)
    assert node_agent.current(HELD) is None, "the held pod must not run"

    node_agent.release(HELD)
    joined = progress.wait(is_event("start", world_size=2), START_TIMEOUT, "node 1 joining after it was scheduled")
    status = progress.wait_phase(C.PHASE_SUCCEEDED, 180)

    raw = assert_ran_exactly_once(progress.metrics_path, epochs)
    assert assert_resumed_from_snapshots(raw) and joined["resume_step"] >= 10
    assert world_size_phases(raw) == [1, 2], world_size_phases(raw)
    scheduled = condition(k8s, C.COND_NODES_UNSCHEDULABLE)
    assert scheduled["status"] == "False", scheduled
    assert status.get("restarts", 0) == 0 and not status.get("failures"), "waiting for capacity is no failure"
    assert node_agent.current(HELD).exit_code == 0
