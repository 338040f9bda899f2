"""Disruptions end to end in the sandbox: the real operator, real torchrun and real training of
the example MLP on the sandbox node, with the cluster's controllers played by the test.

* Preemption: the scheduler marks a node pod DisruptionTarget (PreemptionByScheduler) and
  deletes it; the kubelet stops it. It costs nothing from failurePolicy.maxRestarts.
* A dead node: the pod's Node turns NotReady and its processes die with it; the taint manager
  deletes the pod, which stays Terminating (no kubelet confirms) until the operator
  force-deletes it after failurePolicy.forceDeleteTerminatingAfterSeconds; then the
  replacement starts and joins the training.

Test-speed overrides as in tests/sandbox/test_c10d.py (see ddpjob_sandbox.examples.example_job);
rdzvStore is ``node`` (set explicitly) and the victim is node 1, which does not host the store.
"""
from __future__ import annotations

import time

import pytest

from ddpjob_operator.api import constants as C
from tests.support.elastic_checks import assert_ran_exactly_once, assert_resumed_from_snapshots, world_size_phases
from ddpjob_sandbox.readers import events
from ddpjob_sandbox.scripted import set_disruption_target
from ddpjob_sandbox.node import running_node_agent
from tests.sandbox.scenarios import start_job
from ddpjob_sandbox.examples import trainer_args
from ddpjob_sandbox.metrics import is_event

START_TIMEOUT = 120  # operator + 2 torchrun agents + 2 workers importing torch on 2 shared cores
VICTIM = "mlp-node-1"


@pytest.mark.slow  # ~40 s alone, more on a loaded machine: real training on two shared cores
def test_a_preempted_node_costs_no_restart_even_before_any_snapshot(k8s, operator, node_agent, tmp_path):
    """maxRestarts 0 and no snapshot before the preemption: a counted failure (which progress
    could not excuse either) would fail the job at once."""
    epochs = 2

    def no_budget(spec: dict) -> None:
        spec["failurePolicy"]["maxRestarts"] = 0

    # Snapshots only at epoch ends (every 1000 steps never comes): nothing saved before the preemption.
    args = trainer_args(epochs=epochs, samples=2048, step_sleep=0.1, snapshot_every_steps=1000)
    progress, _ = start_job(k8s, node_agent, tmp_path, args=args, edit=no_budget)
    progress.wait(is_event("step", step=5, world_size=2), START_TIMEOUT, "both nodes training")
    preempted = node_agent.current(VICTIM)
    assert not [e for e in progress.events() if e["event"] == "snapshot"], "a snapshot came before the preemption"
    set_disruption_target(k8s, VICTIM, reason="PreemptionByScheduler",
                          message="Preempted in order to admit critical pod team-a/big", exit_code=None)
    k8s.delete("pods", VICTIM)  # the scheduler evicts the victim; the kubelet stops it gracefully

    # The victim's SIGTERM snapshots the step in flight (trainer/stop.py): nothing is trained again.
    stop = progress.wait(is_event("stop"), 60, "the graceful stop")
    node_agent.wait_for_container(VICTIM, 60, other_than=preempted.uid)
    progress.wait(is_event("start", world_size=2, resume_step=lambda s: s >= stop["step"]), START_TIMEOUT,
                  "the replacement training")
    status = progress.wait_phase(C.PHASE_SUCCEEDED, 180)

    raw = assert_ran_exactly_once(progress.metrics_path, epochs)
    assert assert_resumed_from_snapshots(raw), "no restart after the preemption"
    assert world_size_phases(raw)[0] == 2 and world_size_phases(raw)[-1] == 2, world_size_phases(raw)
    assert preempted.exit_code is not None and preempted.exit_code != 0  # it did stop, and not cleanly
    failures = [(f["pod"], f["podUID"], f["cause"], f["reason"]) for f in status["failures"]]
    assert failures == [(VICTIM, preempted.uid, "Disrupted", "PreemptionByScheduler")], status["failures"]
    assert not status.get("restartsWithoutProgress"), status
    disrupted = [m for kind, reason, m in events(k8s) if (kind, reason) == (C.EVENT_WARNING, C.REASON_NODE_DISRUPTED)]
    assert any(VICTIM in m for m in disrupted), events(k8s)
    assert not [e for e in events(k8s) if e[1] in (C.REASON_NODE_FAILED, C.REASON_RESTARTS_EXHAUSTED)], events(k8s)


@pytest.mark.slow  # ~45 s alone: the survivor re-forms alone, then the replacement joins
def test_a_pod_stuck_terminating_on_a_dead_node_is_force_deleted_and_its_replacement_joins(
        cluster, k8s, operator, tmp_path):
    cluster.emulator.graceful_pod_deletion = True  # a deleted bound pod waits for its kubelet's confirmation
    epochs, force_after = 3, 3

    def policy(spec: dict) -> None:
        spec["failurePolicy"].update(maxRestarts=0, forceDeleteTerminatingAfterSeconds=force_after)

    args = trainer_args(epochs=epochs, samples=2048, step_sleep=0.1, snapshot_every_steps=10)
    with running_node_agent(k8s, tmp_path / "node", bind_nodes=True) as agent:
        try:
            progress, _ = start_job(k8s, agent, tmp_path, args=args, edit=policy)
            progress.wait(is_event("start", world_size=2), START_TIMEOUT, "both nodes training")
            snapshot = progress.wait(is_event("snapshot", step=lambda s: s >= 10), 60, "a snapshot")
            dead_node = agent.node_of(VICTIM)
            lost = agent.node_down(VICTIM)
            # The taint manager evicts the pod from the NotReady node (1 s grace instead of the
            # pod's 30 s, to keep the test short); nobody confirms, so it stays Terminating.
            set_disruption_target(k8s, VICTIM, reason="DeletionByTaintManager",
                                  message="Taint manager: deleting due to NoExecute taint", exit_code=None)
            k8s.delete("pods", VICTIM, gracePeriodSeconds=1)
            deleted_at = time.monotonic()
            time.sleep(2)
            stuck = k8s.find("pods", VICTIM)
            assert stuck is not None and stuck["metadata"]["uid"] == lost.uid and stuck["metadata"]["deletionTimestamp"]

            replacement = agent.wait_for_container(VICTIM, 60, other_than=lost.uid)
            replaced_after = time.monotonic() - deleted_at
            progress.wait(is_event("start", world_size=2), START_TIMEOUT, "the replacement joining the training")
            status = progress.wait_phase(C.PHASE_SUCCEEDED, 180)

            raw = assert_ran_exactly_once(progress.metrics_path, epochs)
            restarts = assert_resumed_from_snapshots(raw)
            assert restarts and restarts[0]["resume_step"] >= snapshot["step"]
            assert world_size_phases(raw)[0] == 2 and world_size_phases(raw)[-1] == 2, world_size_phases(raw)
            # Force-deleted only after the timeout past deletionTimestamp (whole seconds, as the API
            # writes it, so up to 1 s of the 1 s grace may be cut): not by the kubelet (dead).
            assert replaced_after >= force_after, f"replaced after {replaced_after:.1f} s"
            assert agent.node_of(VICTIM) != dead_node and replacement.exit_code == 0
            forced = [m for kind, r, m in events(k8s) if (kind, r) == (C.EVENT_WARNING, C.REASON_FORCE_DELETED)]
            assert len(forced) == 1 and f"node pod {VICTIM} " in forced[0] and f"on node {dead_node} (NotReady)" \
                in forced[0], events(k8s)
            failures = [(f["pod"], f["podUID"], f["cause"], f["reason"]) for f in status["failures"]]
            assert failures == [(VICTIM, lost.uid, "NodeLost", "DeletionByTaintManager")], status["failures"]
            print(f"node down -> replacement started: {replaced_after:.1f} s")
        finally:
            print(f"\n--- sandbox node containers ---\n{agent.logs()}\nnode agent API errors: {agent.errors}")
