"""Disruptions end to end on the real control plane: the helm-installed operator, real torchrun
and real training of the example MLP on the kubelets' Nodes.

* Preemption: the scheduler marks a node pod DisruptionTarget (PreemptionByScheduler) and
  deletes it (played by the test: a real preemption needs a higher-priority pod that does not
  fit); the kubelet stops it. It costs nothing from failurePolicy.maxRestarts.
* A dead Node: its kubelet stops (its processes die with it, nothing renews its Lease); the
  real node-lifecycle controller marks the Node Unknown and taints it unreachable, the real
  taint-eviction controller deletes the pod (DisruptionTarget DeletionByTaintManager), which
  stays Terminating (no kubelet confirms) until the operator force-deletes it after
  failurePolicy.forceDeleteTerminatingAfterSeconds; then the replacement starts on another
  Node and joins the training.

Test-speed overrides as in test_c10d.py (see ddpjob_sandbox.examples.example_job).
"""
from __future__ import annotations

from datetime import datetime

import pytest

from ddpjob_operator.api import constants as C
from tests.support.elastic_checks import assert_ran_exactly_once, assert_resumed_from_snapshots, world_size_phases
from ddpjob_sandbox.readers import events
from ddpjob_sandbox.scripted import set_disruption_target
from ddpjob_sandbox.examples import trainer_args
from ddpjob_sandbox.metrics import is_event
from tests.cluster.sandbox.scenarios import TEST_SECONDS, Sandbox, with_slot

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(TEST_SECONDS)]

START_TIMEOUT = 120  # operator + 2 torchrun agents + 2 workers importing torch on 2 shared cores
UNREACHABLE = "node.kubernetes.io/unreachable"


@pytest.mark.slow  # ~40 s alone, more on a loaded machine: real training on two shared cores
def test_a_preempted_node_costs_no_restart_even_before_any_snapshot(sandbox: Sandbox):
    """maxRestarts 0 and no snapshot before the preemption: a counted failure (which progress
    could not excuse either) would fail the job at once."""
    k8s, nodes, job = sandbox.kube, sandbox.nodes, sandbox.job
    victim = f"{job}-node-1"  # rdzvStore node: node 0 hosts the store
    epochs = 2

    def no_budget(spec: dict) -> None:
        spec["failurePolicy"]["maxRestarts"] = 0

    # Snapshots only at epoch ends (every 1000 steps never comes): nothing saved before the preemption.
    args = trainer_args(epochs=epochs, samples=2048, step_sleep=0.1, snapshot_every_steps=1000)
    progress, _ = sandbox.start_job(args=args, edit=no_budget)
    progress.wait(is_event("step", step=5, world_size=2), START_TIMEOUT, "both nodes training")
    preempted = nodes.current(victim)
    assert not [e for e in progress.events() if e["event"] == "snapshot"], "a snapshot came before the preemption"
    set_disruption_target(k8s, victim, reason="PreemptionByScheduler",
                          message="Preempted in order to admit critical pod team-a/big", exit_code=None)
    k8s.delete("pods", victim)  # the scheduler evicts the victim; the kubelet stops it gracefully

    # The victim's SIGTERM snapshots the step in flight (trainer/stop.py): nothing is trained again.
    stop = progress.wait(is_event("stop"), 60, "the graceful stop")
    nodes.wait_for_container(victim, 60, other_than=preempted.uid)
    progress.wait(is_event("start", world_size=2, resume_step=lambda s: s >= stop["step"]), START_TIMEOUT,
                  "the replacement training")
    status = progress.wait_phase(C.PHASE_SUCCEEDED, 180)

    raw = assert_ran_exactly_once(progress.metrics_path, epochs)
    assert assert_resumed_from_snapshots(raw), "no restart after the preemption"
    assert world_size_phases(raw)[0] == 2 and world_size_phases(raw)[-1] == 2, world_size_phases(raw)
    assert preempted.exit_code is not None and preempted.exit_code != 0  # it did stop, and not cleanly
    failures = [(f["pod"], f["podUID"], f["cause"], f["reason"]) for f in status["failures"]]
    assert failures == [(victim, preempted.uid, "Disrupted", "PreemptionByScheduler")], status["failures"]
    assert not status.get("restartsWithoutProgress"), status
    disrupted = [m for kind, reason, m in events(k8s, job)
                 if (kind, reason) == (C.EVENT_WARNING, C.REASON_NODE_DISRUPTED)]
    assert any(victim in m for m in disrupted), events(k8s, job)
    assert not [e for e in events(k8s, job) if e[1] in (C.REASON_NODE_FAILED, C.REASON_RESTARTS_EXHAUSTED)], \
        events(k8s, job)


@pytest.mark.slow  # ~2 min: the node-lifecycle grace, the survivor re-forms alone, then the replacement joins
def test_a_pod_stuck_terminating_on_a_dead_node_is_force_deleted_and_its_replacement_joins(
        sandbox: Sandbox, control_plane):
    k8s, nodes, job = sandbox.kube, sandbox.nodes, sandbox.job
    epochs, force_after = 3, 3

    def policy(spec: dict) -> None:
        spec["failurePolicy"].update(maxRestarts=0, forceDeleteTerminatingAfterSeconds=force_after)
        with_slot(spec)  # one node pod per Node of the test's own
        # The user's choice: give up on a lost Node at once (the API server's default is 300 s).
        spec["scheduling"]["tolerations"] = [
            {"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 1}]

    args = trainer_args(epochs=epochs, samples=2048, step_sleep=0.1, snapshot_every_steps=10)
    # The store in a pod of its own (no slot: on the session's Nodes), so either node pod may go.
    with sandbox.join_node("a"), sandbox.join_node("b") as b:
        progress, _ = sandbox.start_job(args=args, rdzv_store="pod", edit=policy)
        progress.wait(is_event("start", world_size=2), START_TIMEOUT, "both nodes training")
        snapshot = progress.wait(is_event("snapshot", step=lambda s: s >= 10), 60, "a snapshot")
        victim = next(p for p in (f"{job}-node-0", f"{job}-node-1") if k8s.get("pods", p)["spec"]["nodeName"] == b.name)
        lost = nodes.current(victim)
        b.stop()  # the machine dies: its processes gone, its kubelet silent

        grace = control_plane.layout.node_monitor_grace_seconds
        stuck = k8s.wait_for(lambda: (p := k8s.find("pods", victim)) and p["metadata"].get("deletionTimestamp") and p,
                             timeout=grace + 60, interval=0.2, what=f"the taint manager deleting {victim}")
        assert stuck["metadata"]["uid"] == lost.uid, "the dead kubelet confirmed nothing: the pod stays Terminating"
        with sandbox.join_node("spare") as spare:  # a Node for the replacement (the survivor holds a's slot)
            replacement = nodes.wait_for_container(victim, START_TIMEOUT, other_than=lost.uid)
            replaced = k8s.get("pods", victim)
            progress.wait(is_event("start", world_size=2), START_TIMEOUT, "the replacement joining the training")
            status = progress.wait_phase(C.PHASE_SUCCEEDED, 180)

    raw = assert_ran_exactly_once(progress.metrics_path, epochs)
    restarts = assert_resumed_from_snapshots(raw)
    assert restarts and restarts[0]["resume_step"] >= snapshot["step"]
    assert world_size_phases(raw)[0] == 2 and world_size_phases(raw)[-1] == 2, world_size_phases(raw)
    # Force-deleted only after the timeout past deletionTimestamp (both in whole seconds, as the
    # API writes them): not by the kubelet (dead).
    replaced_after = (seconds(replaced["metadata"]["creationTimestamp"])
                      - seconds(stuck["metadata"]["deletionTimestamp"]))
    assert replaced_after >= force_after - 1, f"replaced {replaced_after:.0f} s after the deletion deadline"
    assert replaced["spec"]["nodeName"] == spare.name and replacement.exit_code == 0
    forced = [m for kind, r, m in events(k8s, job) if (kind, r) == (C.EVENT_WARNING, C.REASON_FORCE_DELETED)]
    assert len(forced) == 1 and f"node pod {victim} " in forced[0] and f"on node {b.name} (Unknown)" in forced[0], \
        events(k8s, job)
    failures = [(f["pod"], f["podUID"], f["cause"], f["reason"]) for f in status["failures"]]
    assert failures == [(victim, lost.uid, "NodeLost", "DeletionByTaintManager")], status["failures"]
    print(f"deletion deadline -> replacement created: {replaced_after:.0f} s")


def seconds(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
