"""Capacity-driven elasticity end to end on the real control plane: one node pod cannot be
scheduled, the job trains at minReplicas with the helm-installed operator, real torchrun and
real training, says why in its status (the real scheduler's words), and grows when the capacity
arrives.

Each node pod asks one ``example.com/slot`` (scenarios.SLOT), an extended resource (as a GPU
is) that only the test's Nodes have: one slot at first, so the real scheduler places one pod and leaves the other
Pending (PodScheduled False, Unschedulable, "... Insufficient example.com/slot"); then a second
Node with a slot joins. Test-speed overrides as in test_c10d.py (see
ddpjob_sandbox.examples.example_job); rdzvStore ``pod``.
"""
from __future__ import annotations

import pytest

from ddpjob_operator.api import constants as C
from ddpjob_sandbox.examples import trainer_args
from ddpjob_sandbox.metrics import is_event
from ddpjob_sandbox.readers import condition, events
from tests.cluster.sandbox.scenarios import SLOT, TEST_SECONDS, Sandbox, with_slot
from tests.support.elastic_checks import assert_ran_exactly_once, assert_resumed_from_snapshots, world_size_phases

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(TEST_SECONDS)]

START_TIMEOUT = 120  # operator + a torchrun agent + a worker importing torch on 2 shared cores


def unscheduled(k8s, pod: str) -> dict | None:
    """Pod ``pod``'s PodScheduled condition while the scheduler cannot place it."""
    conditions = ((k8s.find("pods", pod) or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "PodScheduled" and c["status"] == "False"), None)


@pytest.mark.slow  # ~35-40 s alone, more on a loaded machine: real training on two shared cores
def test_an_unschedulable_node_lets_training_start_at_min_replicas_and_joins_when_scheduled(
        sandbox: Sandbox):
    k8s, nodes, job = sandbox.kube, sandbox.nodes, sandbox.job
    # 12 epochs: ~80 s alone at world size 1, so the node training alone is still at it when the
    # second Node has joined and its pod imported torch (at 2 epochs, ~13 s, it finished first
    # and closed the rendezvous: seen at load 29 on 2 cores).
    epochs, pending_timeout = 12, 3

    def policy(spec: dict) -> None:
        spec["replicas"] = 2
        spec["elasticPolicy"]["minReplicas"] = 1
        spec["scheduling"] = {**(spec.get("scheduling") or {}), "pendingTimeoutSeconds": pending_timeout}
        with_slot(spec)

    with sandbox.join_node("first") as first:
        args = trainer_args(epochs=epochs, samples=2048, step_sleep=0.1, snapshot_every_steps=10)
        # The store in a pod of its own (no slot: on the session's Nodes): with rdzvStore node,
        # node 0 hosts it, and the scheduler may leave node 0 the one Pending.
        progress, _ = sandbox.start_job(args=args, rdzv_store="pod", edit=policy)
        progress.wait(is_event("start", world_size=1), START_TIMEOUT, "one node training alone")
        progress.wait(is_event("snapshot", step=lambda s: s >= 10), 60, "a snapshot at world size 1")
        # Either pod may be the one the scheduler placed on the one slot.
        held = next(p for p in (f"{job}-node-0", f"{job}-node-1") if unscheduled(k8s, p))
        words = unscheduled(k8s, held)
        assert words["reason"] == "Unschedulable" and f"Insufficient {SLOT}" in words["message"], words

        unschedulable = k8s.wait_for(lambda: (c := condition(k8s, C.COND_NODES_UNSCHEDULABLE, job))
                                     and c["status"] == "True" and c, timeout=30,
                                     what="condition NodesUnschedulable True")
        assert unschedulable["reason"] == C.REASON_UNSCHEDULABLE
        message = unschedulable["message"]
        assert f"pendingTimeoutSeconds ({pending_timeout}s)" in message and "training continues on 1 node(s)" in message
        assert f"{held}: Unschedulable: {words['message']}" in message, message
        expected = (C.EVENT_WARNING, C.REASON_UNSCHEDULABLE, message)
        # The operator posts a pass's Events after its status write: this test may be a moment ahead.
        k8s.wait_for(lambda: expected in events(k8s, job), timeout=30, interval=0.2, what="the Unschedulable Event")
        assert nodes.current(held) is None, "the held pod must not run"

        with sandbox.join_node("second") as second:  # capacity arrives: a Node with a slot joins
            joined = progress.wait(is_event("start", world_size=2), START_TIMEOUT,
                                   f"{held} joining after it was scheduled")
            placed = {k8s.get("pods", p)["spec"]["nodeName"] for p in (f"{job}-node-0", f"{job}-node-1")}
            assert placed == {first.name, second.name}, placed
            status = progress.wait_phase(C.PHASE_SUCCEEDED, 180)

    raw = assert_ran_exactly_once(progress.metrics_path, epochs)
    assert assert_resumed_from_snapshots(raw) and joined["resume_step"] >= 10
    assert world_size_phases(raw) == [1, 2], world_size_phases(raw)
    scheduled = condition(k8s, C.COND_NODES_UNSCHEDULABLE, job)
    assert scheduled["status"] == "False", scheduled
    assert status.get("restarts", 0) == 0 and not status.get("failures"), "waiting for capacity is no failure"
    assert nodes.current(held).exit_code == 0
