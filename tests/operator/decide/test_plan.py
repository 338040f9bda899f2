"""Plan: desired vs observed pods -> create / delete / requeue actions (through reconcile)."""

from __future__ import annotations

import pytest

from ddpjob_operator.decide.actions import CreatePod, CreateService, DeleteJob, DeletePod, Requeue
from ddpjob_operator.decide.plan import plan_actions
from ddpjob_operator.render.store_pod import render_store_pod, render_store_service
from ddpjob_operator.decide.reconcile import reconcile
from ddpjob_operator.render.node_pod import render_pod, render_service
from ddpjob_operator.api.validation import parse_spec
from tests.operator.builders import at, job_ref, make_pod, observe, running_pods
from ddpjob_sandbox.jobs import make_ddpjob
from tests.operator.topology_builders import store, with_store


def actions_at(job: dict, pods: list, seconds: float, service_exists: bool = True) -> list:
    """One reconciliation at T0+seconds; the job keeps the new status like the API would."""
    result = reconcile(job, observe(with_store(job, pods), service_exists=service_exists), at(seconds))
    job["status"] = result.status
    return result.actions


def created(actions: list) -> list[str]:
    return [a.body["metadata"]["name"] for a in actions if isinstance(a, CreatePod)]


def deleted(actions: list) -> list[str]:
    return [a.name for a in actions if isinstance(a, DeletePod)]


def requeues(actions: list) -> list[float]:
    return [a.after for a in actions if isinstance(a, Requeue)]


def test_a_new_job_gets_its_service_and_store_pod_then_one_pod_per_replica():
    job = make_ddpjob(replicas=2)
    spec, ref = parse_spec(job["spec"]), job_ref(job)
    actions = actions_at(job, [], 0, service_exists=False)
    assert actions[:3] == [CreateService(render_service(ref, spec)), CreateService(render_store_service(ref, spec)),
                           CreatePod(render_store_pod(ref, spec))]
    assert created(actions) == ["mlp-rdzv"]  # the nodes wait for the store pod to exist
    actions = reconcile(job, observe([store(job)], service_exists=True), at(1)).actions
    assert actions == [CreatePod(render_pod(ref, spec, 0)), CreatePod(render_pod(ref, spec, 1))]


def test_with_the_store_on_node_0_a_new_job_gets_its_service_and_one_pod_per_replica():
    job = make_ddpjob(replicas=2, elasticPolicy={"rdzvStore": "node"})
    actions = actions_at(job, [], 0, service_exists=False)
    spec, ref = parse_spec(job["spec"]), job_ref(job)
    assert actions == [CreateService(render_service(ref, spec)),
                       CreatePod(render_pod(ref, spec, 0)), CreatePod(render_pod(ref, spec, 1))]


def test_a_job_whose_pods_all_run_needs_nothing():
    job = make_ddpjob(replicas=2)
    assert actions_at(job, running_pods(job), 0) == []


def test_scaling_up_creates_the_new_indexes():
    job = make_ddpjob(replicas=4, min_replicas=1, max_replicas=4)
    assert created(actions_at(job, running_pods(job, 2), 0)) == ["mlp-node-2", "mlp-node-3"]


def test_scaling_down_deletes_the_highest_indexes_first():
    job = make_ddpjob(replicas=2, min_replicas=1, max_replicas=4)
    pods = [make_pod(job, i) for i in range(4)]
    actions = actions_at(job, pods, 0)
    assert deleted(actions) == ["mlp-node-3", "mlp-node-2"] and created(actions) == []


def test_a_failed_pod_is_deleted_then_recreated_under_its_name_at_once_the_first_time():
    job = make_ddpjob(replicas=2)  # backoff 10 s, from the second incident in a row
    actions_at(job, running_pods(job), 0)
    first = actions_at(job, [make_pod(job, 0), make_pod(job, 1, phase="Failed", finished_at=at(20))], 21)
    assert (deleted(first), created(first), requeues(first)) == (["mlp-node-1"], [], [2.0])  # the name frees first
    replaced = actions_at(job, [make_pod(job, 0)], 22)
    assert (created(replaced), requeues(replaced)) == (["mlp-node-1"], [])


def test_a_replacement_that_fails_again_waits_the_backoff_and_the_next_twice_as_long():
    job = make_ddpjob(replicas=2)
    actions_at(job, running_pods(job), 0)
    actions_at(job, [make_pod(job, 0), make_pod(job, 1, phase="Failed", finished_at=at(20), uid="a")], 21)
    again = actions_at(job, [make_pod(job, 0), make_pod(job, 1, phase="Failed", finished_at=at(40), uid="b",
                                                         created_at=at(22))], 41)
    assert (deleted(again), created(again), requeues(again)) == (["mlp-node-1"], [], [9.0])
    waiting = actions_at(job, [make_pod(job, 0)], 45)
    assert (created(waiting), requeues(waiting)) == ([], [5.0])
    replaced = actions_at(job, [make_pod(job, 0)], 50)
    assert (created(replaced), requeues(replaced)) == (["mlp-node-1"], [])
    third = actions_at(job, [make_pod(job, 0), make_pod(job, 1, phase="Failed", finished_at=at(100), uid="c",
                                                         created_at=at(50))], 100)
    assert requeues(third) == [20.0]


def test_an_evicted_pod_is_replaced_without_backoff_once_it_is_gone():
    job = make_ddpjob(replicas=2)
    actions = actions_at(job, [make_pod(job, 0), make_pod(job, 1, phase="Failed", reason="Evicted")], 0)
    assert deleted(actions) == ["mlp-node-1"] and requeues(actions) == [2.0]
    assert created(actions_at(job, [make_pod(job, 0)], 1)) == ["mlp-node-1"]


def test_a_name_still_held_by_a_terminating_pod_is_not_reused_yet():
    job = make_ddpjob(replicas=2)
    actions = actions_at(job, [make_pod(job, 0), make_pod(job, 1, deleting=True)], 0)
    assert (created(actions), deleted(actions), requeues(actions)) == ([], [], [2.0])


def test_suspending_deletes_every_pod_and_creates_nothing():
    job = make_ddpjob(replicas=2, runPolicy={"suspend": True})
    actions = actions_at(job, running_pods(job) + [make_pod(job, 5, deleting=True)], 0, service_exists=False)
    assert actions == [DeletePod("mlp-node-0", "the job is suspended"), DeletePod("mlp-node-1", "the job is suspended"),
                       DeletePod("mlp-rdzv", "the job is suspended")]


@pytest.mark.parametrize("policy,deleted_pods", [
    ("None", []),
    ("Running", ["mlp-node-1"]),
    ("All", ["mlp-node-0", "mlp-node-1", "mlp-node-2"]),
])
def test_a_finished_job_cleans_pods_per_clean_pod_policy(policy, deleted_pods):
    job = make_ddpjob(replicas=3, runPolicy={"cleanPodPolicy": policy})
    # Node 0 failed during training (before node 2 finished): that failure decides.
    pods = [make_pod(job, 0, phase="Failed", exit_code=127, finished_at=at(-30)), make_pod(job, 1),
            make_pod(job, 2, phase="Succeeded")]
    actions = actions_at(job, pods, 0)
    assert job["status"]["phase"] == "Failed"
    assert deleted(actions) == deleted_pods and created(actions) == []


def test_a_finished_job_is_deleted_once_its_ttl_has_passed():
    job = make_ddpjob(replicas=1, runPolicy={"ttlSecondsAfterFinished": 100})
    assert actions_at(job, [make_pod(job, 0, phase="Succeeded")], 0) == [Requeue(100.0)]
    assert actions_at(job, [make_pod(job, 0, phase="Succeeded")], 60) == [Requeue(40.0)]
    assert actions_at(job, [], 100) == [DeleteJob("ttlSecondsAfterFinished (100) passed")]


def test_without_a_ttl_a_finished_job_stays():
    job = make_ddpjob(replicas=1)
    assert actions_at(job, [make_pod(job, 0, phase="Succeeded")], 0) == []


def test_a_running_job_with_a_deadline_is_requeued_for_the_deadline():
    job = make_ddpjob(replicas=1, runPolicy={"activeDeadlineSeconds": 600})
    actions_at(job, [], 0)
    assert actions_at(job, running_pods(job), 100) == [Requeue(500.0)]


def test_passing_the_deadline_deletes_the_running_pods():
    job = make_ddpjob(replicas=1, runPolicy={"activeDeadlineSeconds": 60})
    actions_at(job, [], 0)
    assert deleted(actions_at(job, running_pods(job), 61)) == ["mlp-node-0", "mlp-rdzv"]


def test_once_a_node_succeeded_missing_or_failed_nodes_are_not_replaced():
    job = make_ddpjob(replicas=3)
    pods = [make_pod(job, 0, phase="Succeeded"), make_pod(job, 1), make_pod(job, 2, phase="Failed")]
    actions = actions_at(job, pods, 0)
    assert (created(actions), deleted(actions)) == ([], [])


def test_an_invalid_spec_plans_nothing():
    job = make_ddpjob(replicas=2)
    pods = running_pods(job, 1)
    job["spec"]["replicas"] = 0
    assert actions_at(job, pods, 0, service_exists=False) == []


def test_only_the_earliest_requeue_is_returned():
    job = make_ddpjob(replicas=2, runPolicy={"activeDeadlineSeconds": 600})
    actions_at(job, [], 0)
    actions = actions_at(job, [make_pod(job, 0), make_pod(job, 1, deleting=True)], 10)
    assert requeues(actions) == [2.0]


def test_plan_actions_can_be_called_with_any_status():
    job = make_ddpjob(replicas=1)
    spec = parse_spec(job["spec"])
    actions = plan_actions(job_ref(job), spec, {"phase": "Running"}, observe([store(job)], service_exists=True), at(0))
    assert created(actions) == ["mlp-node-0"]
    assert plan_actions(job_ref(job), None, {}, observe([], service_exists=False), at(0)) == []


def test_success_with_unscheduled_pods_deletes_them_under_the_default_policy():
    job = make_ddpjob(replicas=3, min_replicas=1, max_replicas=3)
    pods = [make_pod(job, 0, phase="Succeeded"), make_pod(job, 1, phase="Pending"), make_pod(job, 2, phase="Pending")]
    assert deleted(actions_at(job, pods, 0)) == ["mlp-node-1", "mlp-node-2"]
