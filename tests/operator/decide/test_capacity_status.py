"""Capacity, pure: node counts, pods the scheduler cannot place (reported after
scheduling.pendingTimeoutSeconds, never blocking the job), preemption shrinking the job,
and the Kueue pod-group labels."""

from __future__ import annotations

import pytest

from ddpjob_operator.api import constants as C
from ddpjob_operator.render.etcd_pod import render_etcd_pod
from ddpjob_operator.render.kueue import kueue_metadata
from ddpjob_operator.decide.actions import CreatePod, Requeue
from ddpjob_operator.render.store_pod import render_store_pod
from ddpjob_operator.render.node_pod import render_pod
from ddpjob_operator.api.validation import parse_spec
from tests.operator.builders import T0, at, job_ref
from ddpjob_sandbox.jobs import make_ddpjob
from tests.operator import topology_builders
from tests.operator.topology_builders import gen_pod, scheduled_pending, unscheduled, with_store

GPU_MESSAGE = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."


def step(job: dict, pods: list, seconds: float):
    """One reconciliation with the job's store pod running (the c10d default) next to `pods`."""
    return topology_builders.step(job, with_store(job, pods), seconds)


def capacity_job(**fields):
    return make_ddpjob(replicas=3, min_replicas=2, max_replicas=3,
                       scheduling={"pendingTimeoutSeconds": 60}, **fields)


def condition(status: dict) -> dict | None:
    return next((c for c in status.get("conditions", []) if c["type"] == C.COND_NODES_UNSCHEDULABLE), None)


def test_status_counts_desired_scheduled_running_and_in_rendezvous_nodes():
    job = capacity_job()
    pods = [gen_pod(job, 0, 0), gen_pod(job, 1, 0, ready=False), unscheduled(job, 2, T0)]
    status = step(job, pods, 0).status
    assert {k: status[k] for k in ("desiredReplicas", "scheduledReplicas", "runningReplicas",
                                    "rendezvousReplicas")} == {
        "desiredReplicas": 3, "scheduledReplicas": 2, "runningReplicas": 2, "rendezvousReplicas": 1}
    assert status["unschedulable"] == [f"mlp-node-2: Unschedulable: {GPU_MESSAGE}"]


def test_a_pod_bound_to_a_node_but_still_pending_counts_as_scheduled():
    job = capacity_job()
    status = step(job, [gen_pod(job, 0, 0), gen_pod(job, 1, 0), scheduled_pending(job, 2)], 0).status
    assert (status["scheduledReplicas"], status["runningReplicas"], status.get("unschedulable")) == (3, 2, None)


def test_before_the_timeout_an_unschedulable_pod_is_listed_but_raises_no_condition():
    job = capacity_job()
    result = step(job, [gen_pod(job, 0, 0), gen_pod(job, 1, 0), unscheduled(job, 2, T0)], 30)
    assert condition(result.status) is None
    assert C.REASON_UNSCHEDULABLE not in [e.reason for e in result.events]
    assert [a.after for a in result.actions if isinstance(a, Requeue)] == [30.0]  # wakes at the timeout


def test_past_the_timeout_the_job_runs_at_min_and_reports_the_scheduler_reason_once():
    job = capacity_job()
    pods = [gen_pod(job, 0, 0), gen_pod(job, 1, 0), unscheduled(job, 2, T0)]
    result = step(job, pods, 61)
    assert result.status["phase"] == "Running"
    message = ("1 node pod(s) not scheduled for over spec.scheduling.pendingTimeoutSeconds (60s); "
               "training continues on 2 node(s) (minReplicas 2); the others join when scheduled: "
               f"mlp-node-2: Unschedulable: {GPU_MESSAGE}")
    assert (condition(result.status)["status"], condition(result.status)["message"]) == ("True", message)
    assert [(e.type, e.reason, e.message) for e in result.events if e.reason == C.REASON_UNSCHEDULABLE] == [
        ("Warning", C.REASON_UNSCHEDULABLE, message)]
    assert step(job, pods, 90).events == []


def test_below_min_past_the_timeout_the_job_waits_and_says_so():
    job = capacity_job()
    result = step(job, [gen_pod(job, 0, 0), unscheduled(job, 1, T0), unscheduled(job, 2, T0)], 61)
    assert result.status["phase"] == "Pending"
    assert "training waits: 1 of minReplicas 2 node(s) running" in condition(result.status)["message"]


def test_a_late_pod_that_gets_scheduled_joins_and_clears_the_condition():
    job = capacity_job()
    step(job, [gen_pod(job, 0, 0), gen_pod(job, 1, 0), unscheduled(job, 2, T0)], 61)
    result = step(job, [gen_pod(job, i, 0) for i in range(3)], 120)
    assert (result.status["phase"], result.status["runningReplicas"]) == ("Running", 3)
    assert (condition(result.status)["status"], condition(result.status)["reason"]) == ("False", C.REASON_SCHEDULED)
    assert [e.reason for e in result.events] == [C.REASON_SCHEDULED]


def test_a_pod_held_by_a_queue_is_reported_with_the_gate_reason():
    job = capacity_job()
    pods = [unscheduled(job, i, T0, reason="SchedulingGated", message="Scheduling is blocked due to "
                        "non-empty scheduling gates") for i in range(3)]
    status = step(job, pods, 61).status
    assert status["unschedulable"][0] == ("mlp-node-0: SchedulingGated: Scheduling is blocked due to "
                                          "non-empty scheduling gates")
    assert condition(status)["status"] == "True"


def test_a_preempted_node_shrinks_the_job_to_min_instead_of_failing_it():
    job = capacity_job(failurePolicy={"maxRestarts": 0})
    step(job, [gen_pod(job, i, 0) for i in range(3)], 0)
    preempted = gen_pod(job, 2, 0, phase="Failed", exit_code=137, disrupted=True)
    result = step(job, [gen_pod(job, 0, 0), gen_pod(job, 1, 0), preempted], 10)
    assert (result.status.get("restarts", 0), result.status["phase"]) == (0, "Restarting")
    replacement = step(job, [gen_pod(job, 0, 0), gen_pod(job, 1, 0)], 11)
    assert [a.body["metadata"]["name"] for a in replacement.actions if isinstance(a, CreatePod)] == ["mlp-node-2"]
    waiting = step(job, [gen_pod(job, 0, 0), gen_pod(job, 1, 0), unscheduled(job, 2, at(11))], 100)
    assert (waiting.status["phase"], waiting.status.get("restarts", 0)) == ("Running", 0)
    assert waiting.status["runningReplicas"] == 2


# --- Kueue -----------------------------------------------------------------------------

def test_a_queue_name_puts_kueue_pod_group_labels_and_count_on_every_node_pod():
    job = make_ddpjob(replicas=3, max_replicas=4, scheduling={"queueName": "team-a"})
    ref, spec = job_ref(job), parse_spec(job["spec"])
    for index in range(3):
        meta = render_pod(ref, spec, index)["metadata"]
        assert {k: meta["labels"][k] for k in (C.LABEL_KUEUE_QUEUE, C.LABEL_KUEUE_POD_GROUP)} == {
            "kueue.x-k8s.io/queue-name": "team-a", "kueue.x-k8s.io/pod-group-name": "mlp"}
        assert meta["annotations"] == {"kueue.x-k8s.io/pod-group-total-count": "3",  # replicas, not max
                                       "kueue.x-k8s.io/safe-to-forcefully-delete": "true"}


def test_user_annotations_are_kept_next_to_the_kueue_count():
    job = make_ddpjob(replicas=2, scheduling={"queueName": "q"}, podOverrides={"annotations": {"team": "x"}})
    meta = render_pod(job_ref(job), parse_spec(job["spec"]), 0)["metadata"]
    assert meta["annotations"] == {"team": "x", "kueue.x-k8s.io/pod-group-total-count": "2",
                                   "kueue.x-k8s.io/safe-to-forcefully-delete": "true"}


@pytest.mark.parametrize("elastic,render", [
    ({}, lambda ref, spec: render_store_pod(ref, spec)),
    ({"rdzvBackend": "etcd-v3", "managedEtcd": {"enabled": True}}, lambda ref, spec: render_etcd_pod(ref, spec)),
], ids=["c10d store pod", "managed etcd pod"])
def test_a_queued_jobs_companion_pod_names_the_queue_so_kueue_counts_it_in_the_jobs_quota(elastic, render):
    queued = make_ddpjob(replicas=2, scheduling={"queueName": "team-a"}, elasticPolicy=elastic)
    labels = render(job_ref(queued), parse_spec(queued["spec"]))["metadata"]["labels"]
    assert labels["kueue.x-k8s.io/queue-name"] == "team-a"
    assert C.LABEL_KUEUE_POD_GROUP not in labels  # its own one-pod Workload: the nodes' group keeps its count
    plain = make_ddpjob(replicas=2, elasticPolicy=elastic)
    assert C.LABEL_KUEUE_QUEUE not in render(job_ref(plain), parse_spec(plain["spec"]))["metadata"]["labels"]


def test_without_a_queue_name_pods_carry_no_kueue_metadata():
    job = make_ddpjob(replicas=2)
    assert kueue_metadata(job_ref(job), parse_spec(job["spec"])) == ({}, {})
    meta = render_pod(job_ref(job), parse_spec(job["spec"]), 0)["metadata"]
    assert not any(k.startswith("kueue.x-k8s.io/") for k in {**meta["labels"], **meta.get("annotations", {})})


def test_the_store_pod_stays_out_of_the_kueue_group_but_in_the_queue():
    job = make_ddpjob(replicas=2, scheduling={"queueName": "q"}, elasticPolicy={"rdzvStore": "pod"})
    meta = render_store_pod(job_ref(job), parse_spec(job["spec"]))["metadata"]
    kueue = {k: v for k, v in {**meta["labels"], **meta.get("annotations", {})}.items()
             if k.startswith("kueue.x-k8s.io/")}
    assert kueue == {"kueue.x-k8s.io/queue-name": "q"}  # its own Workload, in the job's quota; not in the group
