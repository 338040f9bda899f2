"""Plan: the job's PodDisruptionBudget is created, patched on scale and deleted when turned off (through reconcile)."""
from __future__ import annotations

from ddpjob_operator.api.validation import parse_spec
from ddpjob_operator.decide.actions import CreateDisruptionBudget, DeleteDisruptionBudget, PatchDisruptionBudget
from ddpjob_operator.decide.observed import ObservedBudget
from ddpjob_operator.decide.reconcile import reconcile
from ddpjob_operator.render.pdb import budget_spec, render_disruption_budget
from ddpjob_sandbox.jobs import make_ddpjob
from tests.operator.builders import at, job_ref, make_pod, observe, running_pods
from tests.operator.topology_builders import store, with_store

BUDGET_ACTIONS = (CreateDisruptionBudget, PatchDisruptionBudget, DeleteDisruptionBudget)


def budget_actions(job: dict, observed: ObservedBudget | None) -> list:
    result = reconcile(job, observe(with_store(job, running_pods(job)), disruption_budget=observed), at(1))
    return [a for a in result.actions if isinstance(a, BUDGET_ACTIONS)]


def elastic(replicas: int, **fields) -> dict:
    return make_ddpjob(replicas=replicas, min_replicas=2, max_replicas=8, **fields)


def test_a_job_without_its_budget_gets_one_and_a_current_one_is_left_alone():
    job = elastic(4)
    ref, spec = job_ref(job), parse_spec(job["spec"])
    assert budget_actions(job, ObservedBudget(None)) == [CreateDisruptionBudget(render_disruption_budget(ref, spec))]
    assert budget_actions(job, ObservedBudget(budget_spec(ref, spec))) == []


def test_a_scaled_job_gets_its_budget_patched_to_the_new_size():
    before = elastic(2)
    observed = ObservedBudget(budget_spec(job_ref(before), parse_spec(before["spec"])))
    assert observed.spec["minAvailable"] == 1 + 1  # at its minimum: one node pod may go, + the store pod
    after = elastic(6)
    [patch] = budget_actions(after, observed)
    assert patch == PatchDisruptionBudget("mlp", {"spec": budget_spec(job_ref(after), parse_spec(after["spec"]))})
    assert patch.patch["spec"]["minAvailable"] == 2 + 1  # down to minReplicas, + the store pod


def test_a_budget_someone_edited_is_put_back():
    job = elastic(4)
    edited = {**budget_spec(job_ref(job), parse_spec(job["spec"])), "minAvailable": 5}
    assert [type(a) for a in budget_actions(job, ObservedBudget(edited))] == [PatchDisruptionBudget]


def test_turning_the_budget_off_deletes_one_that_exists_and_creates_none():
    job = elastic(4, runPolicy={"podDisruptionBudget": False})
    assert budget_actions(job, ObservedBudget({"minAvailable": 3})) == [DeleteDisruptionBudget("mlp")]
    assert budget_actions(job, ObservedBudget(None)) == []


def test_nothing_is_planned_for_a_budget_that_was_not_read():
    assert budget_actions(elastic(4), None) == []  # forbidden, or the job finished


def test_a_server_that_drops_the_unhealthy_pod_policy_is_not_patched_on_every_pass():
    job = elastic(4)
    kept = {k: v for k, v in budget_spec(job_ref(job), parse_spec(job["spec"])).items()
            if k != "unhealthyPodEvictionPolicy"}  # as a server before Kubernetes 1.26 stores it
    assert budget_actions(job, ObservedBudget(kept)) == []


def test_a_budget_of_the_same_name_that_someone_else_owns_is_left_alone():
    owned = {"metadata": {"ownerReferences": [{"uid": "job-uid", "controller": True}]}, "spec": {"minAvailable": 1}}
    assert ObservedBudget.of(owned, "job-uid") == ObservedBudget({"minAvailable": 1})
    assert ObservedBudget.of(owned, "other-uid") is None  # nothing is planned for it (see the test above)
    assert ObservedBudget.of({"metadata": {}, "spec": {}}, "job-uid") is None
    assert ObservedBudget.of(None, "job-uid") == ObservedBudget(None)


def test_a_job_running_at_its_minimum_gets_a_budget_that_allows_one_eviction():
    job = elastic(4)  # minReplicas 2: two nodes run, two wait for room
    pending = [make_pod(job, i, phase="Pending") for i in (2, 3)]
    ready_store = {**store(job), "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}
    observed = observe(running_pods(job, 2) + [ready_store] + pending, disruption_budget=ObservedBudget(
        budget_spec(job_ref(job), parse_spec(job["spec"]))))  # as the whole job's budget: 2 + 1 of 3 Ready
    [patch] = [a for a in reconcile(job, observed, at(1)).actions if isinstance(a, BUDGET_ACTIONS)]
    assert patch.patch["spec"]["minAvailable"] == (2 + 1) - 1  # the Ready pods less one: a drain may evict one
