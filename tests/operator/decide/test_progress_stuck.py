"""Force-deleting pods stuck terminating on a node that is down (pure, fixed clock)."""
from __future__ import annotations

import pytest

from ddpjob_operator.api.clock import format_time
from ddpjob_operator.decide.actions import DeletePod, Requeue
from ddpjob_operator.api.validation import parse_spec
from ddpjob_operator.decide.observed import view_pod
from ddpjob_operator.decide.stuck import nodes_to_read, stuck_pods, with_force_deletions
from tests.operator.builders import at, make_pod
from ddpjob_sandbox.jobs import make_ddpjob

JOB = make_ddpjob(replicas=2, failurePolicy={"forceDeleteTerminatingAfterSeconds": 60})


def node(ready: str | None):
    conditions = [] if ready is None else [{"type": "Ready", "status": ready}]
    return {"metadata": {"name": "gpu-a"}, "status": {"conditions": conditions}}


def terminating(index=1, deleted_at=0, node_name="gpu-a"):
    pod = make_pod(JOB, index)
    pod["metadata"]["deletionTimestamp"] = format_time(at(deleted_at))
    pod["spec"]["nodeName"] = node_name
    return view_pod(pod)


@pytest.mark.parametrize("state,forced", [("False", "NotReady"), ("Unknown", "Unknown"), (None, "Unknown"),
                                          ("True", None)])
def test_only_pods_on_a_node_that_is_not_ready_are_forced_after_the_timeout(state, forced):
    due, _ = stuck_pods([terminating()], {"gpu-a": node(state)}, at(60), 60)
    assert [p.node_state for p in due] == ([forced] if forced else [])


def test_a_vanished_node_counts_as_gone_and_an_unread_one_as_unknown():
    assert [p.node_state for p in stuck_pods([terminating()], {"gpu-a": None}, at(61), 60)[0]] == ["gone"]
    assert stuck_pods([terminating()], {}, at(61), 60)[0] == []  # reading nodes was forbidden


def test_before_the_timeout_nothing_is_forced_but_a_look_is_scheduled():
    due, wait = stuck_pods([terminating(deleted_at=0)], {"gpu-a": node("False")}, at(45), 60)
    assert due == [] and wait == pytest.approx(15)


def test_the_timeout_null_turns_force_deletion_off():
    assert stuck_pods([terminating()], {"gpu-a": node("False")}, at(1000), None) == ([], None)


def test_only_nodes_of_pods_past_their_deletion_timestamp_are_read():
    pods = [terminating(0, deleted_at=10, node_name="a"), terminating(1, deleted_at=-5, node_name="b"),
            view_pod(make_pod(JOB, 0)), terminating(1, deleted_at=-5, node_name="")]
    assert nodes_to_read(pods, at(0)) == ["b"]


def test_a_forced_delete_replaces_the_plain_one_and_keeps_the_earliest_requeue():
    spec = parse_spec(JOB["spec"])
    stuck, soon = terminating(1, deleted_at=0), terminating(0, deleted_at=50, node_name="gpu-a")
    actions, events = with_force_deletions(spec, [stuck, soon], {"gpu-a": node("False")}, at(70),
                                           [DeletePod("mlp-node-1", "replacing"), Requeue(60.0)])
    assert actions == [DeletePod("mlp-node-1", events[0].message, grace_period_seconds=0), Requeue(40.0)]
    assert events[0].reason == "ForceDeleted" and events[0].message == (
        "node pod mlp-node-1 was stuck terminating for 70s on node gpu-a (NotReady); force-deleted after "
        "spec.failurePolicy.forceDeleteTerminatingAfterSeconds (60s)")


def test_a_kueue_queued_job_leaves_kueue_the_first_force_delete_and_acts_as_the_fallback():
    spec = parse_spec(make_ddpjob(replicas=2, scheduling={"queueName": "q"},
                                  failurePolicy={"forceDeleteTerminatingAfterSeconds": 60})["spec"])
    stuck, down = terminating(1, deleted_at=0), {"gpu-a": node("False")}
    waiting, none = with_force_deletions(spec, [stuck], down, at(70), [])
    assert (waiting, none) == ([Requeue(290.0)], [])  # 60 s + Kueue's 300 s head start, 70 s gone
    actions, events = with_force_deletions(spec, [stuck], down, at(360), [])
    assert actions == [DeletePod("mlp-node-1", events[0].message, grace_period_seconds=0)]
    assert events[0].message == (
        "node pod mlp-node-1 was stuck terminating for 360s on node gpu-a (NotReady); force-deleted after "
        "spec.failurePolicy.forceDeleteTerminatingAfterSeconds (60s) plus 300s left to Kueue's "
        "FailureRecoveryPolicy (spec.scheduling.queueName is set)")
