"""An invalid edit does not orphan a running job: it goes on with its last valid spec
(status.lastValid), replacing failed pods from it and keeping its deadline, while
InvalidSpec says what is wrong (pure, through reconcile)."""

from __future__ import annotations

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.validation import parse_spec
from ddpjob_operator.decide import last_valid
from ddpjob_operator.decide.actions import CreatePod, DeletePod, Event
from ddpjob_operator.decide.reconcile import Reconciliation, reconcile
from ddpjob_operator.render.node_pod import render_pod
from ddpjob_sandbox.jobs import make_ddpjob
from tests.operator.builders import at, job_ref, make_pod, observe, running_pods

ETCD_WITHOUT_ENDPOINTS = {"rdzvStore": "node", "rdzvBackend": "etcd"}  # a rule only the operator checks
INVALID = ("spec.elasticPolicy.rdzvEndpoints ([]) must list at least one etcd host:port when rdzvBackend "
           "is etcd (or set managedEtcd.enabled: true)")
KEPT = INVALID + "; the job goes on with its last valid spec (generation 1) until the spec is fixed"


def step(job: dict, pods: list, seconds: float, **kwargs) -> Reconciliation:
    """One pass at T0+seconds; the job keeps the new status, as the API would."""
    result = reconcile(job, observe(pods), at(seconds), **kwargs)
    job["status"] = result.status
    return result


def edit(job: dict, **spec_fields) -> None:
    """A user's edit: the spec changes and metadata.generation goes up."""
    job["spec"] = {**job["spec"], **spec_fields}
    job["metadata"]["generation"] += 1


def invalid_spec(job: dict) -> dict:
    return next(c for c in job["status"]["conditions"] if c["type"] == C.COND_INVALID_SPEC)


def running_job(**fields) -> tuple[dict, list[dict]]:
    job = make_ddpjob(replicas=2, args=["--epochs", "2"], elasticPolicy={"rdzvStore": "node"}, **fields)
    pods = running_pods(job)
    step(job, pods, 0)
    assert job["status"]["phase"] == C.PHASE_RUNNING
    return job, pods


def test_each_valid_pass_records_the_spec_and_its_generation():
    job, pods = running_job()
    assert job["status"]["lastValid"] == {"generation": 1, "spec": job["spec"]}
    edit(job, args=["--epochs", "3"])
    step(job, pods, 5)
    assert job["status"]["lastValid"] == {"generation": 2, "spec": job["spec"]}


def test_an_invalid_edit_while_running_still_replaces_a_failed_pod_from_the_old_spec():
    job, pods = running_job()
    old_spec = parse_spec(job["spec"])
    edit(job, args=["--epochs", "99"], elasticPolicy=ETCD_WITHOUT_ENDPOINTS)
    edited = step(job, pods, 10)
    assert job["status"]["phase"] == C.PHASE_RUNNING and invalid_spec(job)["status"] == "True"
    assert invalid_spec(job)["message"] == KEPT and Event("Warning", "InvalidSpec", KEPT) in edited.events
    failed = [pods[0], make_pod(job_with(old_spec, job), 1, phase="Failed", exit_code=1)]
    assert DeletePod("mlp-node-1", "replacing a failed node pod") in step(job, failed, 20).actions
    assert job["status"]["phase"] == C.PHASE_RESTARTING and job["status"]["restarts"] == 1
    replaced = step(job, [pods[0]], 60).actions  # the failed pod is gone and the backoff passed
    assert [a for a in replaced if isinstance(a, CreatePod)] == [CreatePod(render_pod(job_ref(job), old_spec, 1))]
    assert "99" not in str(replaced), "the replacement must run the last valid spec, not the invalid edit"


def test_an_invalid_edit_while_running_still_enforces_the_deadline():
    job, pods = running_job(runPolicy={"activeDeadlineSeconds": 60})
    edit(job, elasticPolicy=ETCD_WITHOUT_ENDPOINTS)
    step(job, pods, 10)
    assert job["status"]["phase"] == C.PHASE_RUNNING
    result = step(job, pods, 61)
    failed = next(c for c in job["status"]["conditions"] if c["type"] == C.COND_FAILED)
    assert (job["status"]["phase"], failed["reason"]) == (C.PHASE_FAILED, C.REASON_DEADLINE)
    assert {a.name for a in result.actions if isinstance(a, DeletePod)} == {"mlp-node-0", "mlp-node-1"}


def test_the_invalid_spec_event_comes_once_and_a_fix_clears_the_condition_and_records_the_new_spec():
    job, pods = running_job()
    edit(job, elasticPolicy=ETCD_WITHOUT_ENDPOINTS)
    assert [e.reason for e in step(job, pods, 10).events] == ["InvalidSpec"]
    assert step(job, pods, 20).events == [] and job["status"]["lastValid"]["generation"] == 1
    edit(job, elasticPolicy={"rdzvStore": "node"})
    step(job, pods, 30)
    assert invalid_spec(job)["status"] == "False" and job["status"]["lastValid"]["generation"] == 3


def test_an_edit_above_the_operators_max_replicas_keeps_the_job_at_its_old_size():
    job, pods = running_job()
    edit(job, replicas=600, elasticPolicy={"rdzvStore": "node", "maxReplicas": 600})
    result = step(job, pods, 10, max_replicas=500)
    assert not [a for a in result.actions if isinstance(a, CreatePod)] and job["status"]["phase"] == C.PHASE_RUNNING
    assert invalid_spec(job)["message"].startswith(
        "spec.replicas (600) must be <= 500, the operator's --max-replicas setting; "
        "spec.elasticPolicy.maxReplicas (600) must be <= 500")


def test_a_job_that_was_never_valid_has_nothing_to_fall_back_on():
    job = make_ddpjob(replicas=2, elasticPolicy=ETCD_WITHOUT_ENDPOINTS)
    result = step(job, [], 0)
    assert (job["status"]["phase"], result.actions) == (C.PHASE_FAILED, [])
    assert invalid_spec(job)["message"] == INVALID and "lastValid" not in job["status"]


def test_a_spec_too_large_to_keep_is_not_recorded_and_an_invalid_edit_then_stops_as_before():
    job, pods = running_job(env=[{"name": f"V{i}", "value": "x" * 600} for i in range(120)])
    assert "lastValid" not in job["status"] and len(str(job["spec"])) > last_valid.MAX_SPEC_BYTES
    edit(job, elasticPolicy=ETCD_WITHOUT_ENDPOINTS)
    result = step(job, pods, 10)
    assert (job["status"]["phase"], result.actions) == (C.PHASE_FAILED, [])


def job_with(spec, job: dict) -> dict:
    """``job`` with the spec its pods were rendered from (for make_pod)."""
    return {**job, "spec": spec.model_dump(by_alias=True, exclude_none=True)}
