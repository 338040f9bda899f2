"""Creating a job's objects: the PodCreateFailed condition from a refused create, the
operator's --max-replicas cap and the bounded batch of creates per pass (pure, through reconcile)."""

from __future__ import annotations

import pytest

from ddpjob_operator.api import constants as C
from ddpjob_operator.decide import creation
from ddpjob_operator.decide.actions import CreatePod, Event, Requeue
from ddpjob_operator.decide.creation import CreateFailure, create_failed_condition
from ddpjob_operator.decide.reconcile import Reconciliation, reconcile
from ddpjob_sandbox.jobs import make_ddpjob
from tests.operator.builders import at, make_pod, observe
from tests.operator.topology_builders import STORE_ON_NODE

QUOTA = CreateFailure("Pod", "mlp-node-1", 403, "Forbidden",
                      'pods "mlp-node-1" is forbidden: exceeded quota: gpu-quota, requested: pods=1, '
                      'used: pods=1, limited: pods=1')
QUOTA_MESSAGE = ('creating Pod mlp-node-1 failed (HTTP 403 Forbidden): pods "mlp-node-1" is forbidden: '
                 'exceeded quota: gpu-quota, requested: pods=1, used: pods=1, limited: pods=1; '
                 'the operator retries with a growing delay')
INVALID = CreateFailure("Pod", "mlp-node-0", 422, "Invalid",
                        'Pod "mlp-node-0" is invalid: spec.containers[0].resources.requests: Invalid value: "2": '
                        'must be less than or equal to cpu limit')


def step(job: dict, pods: list, seconds: float, failure: CreateFailure | None = None,
         **kwargs) -> Reconciliation:
    """One pass at T0+seconds given the previous pass's refused create; the job keeps the status."""
    result = reconcile(job, observe(pods), at(seconds), create_failure=failure, **kwargs)
    job["status"] = result.status
    return result


def create_condition(job: dict) -> dict | None:
    return next((c for c in job["status"].get("conditions") or [] if c["type"] == C.COND_POD_CREATE_FAILED), None)


def test_a_quota_refusal_sets_the_condition_and_posts_one_warning_until_the_message_changes():
    job = make_ddpjob(replicas=2, **STORE_ON_NODE)
    pods = [make_pod(job, 0)]
    step(job, pods, 0)
    first = step(job, pods, 2, QUOTA)
    assert create_condition(job) == {"type": "PodCreateFailed", "status": "True", "reason": "Forbidden",
                                     "message": QUOTA_MESSAGE, "lastTransitionTime": "2026-01-01T12:00:02Z"}
    assert first.events == [Event("Warning", "PodCreateFailed", QUOTA_MESSAGE)]
    again = step(job, pods, 10, CreateFailure(**{**QUOTA.__dict__, "attempts": 4}))
    assert again.events == [] and create_condition(job)["lastTransitionTime"] == "2026-01-01T12:00:02Z"
    other = step(job, pods, 20, INVALID)
    assert [e.reason for e in other.events] == ["PodCreateFailed"] and create_condition(job)["reason"] == "Invalid"


def test_the_condition_goes_false_with_a_normal_event_once_creates_succeed_and_stays_absent_otherwise():
    job = make_ddpjob(replicas=2, **STORE_ON_NODE)
    assert step(job, [], 0).events[-1].reason == C.REASON_CREATED and create_condition(job) is None
    step(job, [], 2, QUOTA)
    recovered = step(job, [], 30)
    assert create_condition(job) == {"type": "PodCreateFailed", "status": "False", "reason": "CreateSucceeded",
                                     "message": C.MSG_CREATES_SUCCEED, "lastTransitionTime": "2026-01-01T12:00:30Z"}
    assert recovered.events == [Event("Normal", "CreateSucceeded", C.MSG_CREATES_SUCCEED)]
    assert step(job, [], 40).events == []


def test_the_condition_alone_never_changes_the_phase():
    job = make_ddpjob(replicas=3, min_replicas=2, max_replicas=3, **STORE_ON_NODE)  # 2 running of 3: Running
    running = [make_pod(job, 0), make_pod(job, 1)]
    step(job, running, 0)
    phase = job["status"]["phase"]
    for seconds, failure in ((2, QUOTA), (4, INVALID), (6, None)):
        assert step(job, running, seconds, failure).status["phase"] == phase == C.PHASE_RUNNING


@pytest.mark.parametrize("failure, reported, reason", [
    (CreateFailure("Pod", "p", 503, "ServiceUnavailable", "etcd leader changed"), False, None),
    (CreateFailure("Pod", "p", 503, "ServiceUnavailable", "etcd leader changed", attempts=3), True,
     "ServiceUnavailable"),
    (CreateFailure("Pod", "p", 429, "TooManyRequests", "slow down", attempts=2), False, None),
    (CreateFailure("Pod", "p", 500, "InternalError", 'failed calling webhook "pods.acme.io"', attempts=3), True,
     "InternalError"),
    (CreateFailure("Service", "mlp", 502, "", "<html>bad gateway</html>", attempts=5), True, "HTTP502"),
    (CreateFailure("Pod", "p", None, "", "ServerDisconnectedError()", attempts=3), True, "NoAnswer"),
    (CreateFailure("Pod", "p", 400, "BadRequest", "bad"), True, "BadRequest"),
], ids=["503 once", "503 thrice", "429 twice", "webhook 500", "proxy 502", "no answer", "400"])
def test_the_servers_own_trouble_is_reported_only_once_it_persists(failure, reported, reason):
    change = create_failed_condition(failure, None)
    assert (change is not None) == reported
    if reported:
        assert (change.status, change.reason) == ("True", reason)


def test_a_transient_error_after_a_refusal_leaves_the_condition_as_it_was():
    old = {"type": "PodCreateFailed", "status": "True", "reason": "Forbidden", "message": QUOTA_MESSAGE}
    assert create_failed_condition(CreateFailure("Pod", "p", 503, "ServiceUnavailable", "x"), old) is None


def test_a_long_api_message_is_cut_in_the_condition():
    change = create_failed_condition(CreateFailure("Pod", "p", 422, "Invalid", "x" * 5000), None)
    assert len(change.message) < creation.MESSAGE_CHARS + 120
    assert change.message.endswith("...; the operator retries with a growing delay")


@pytest.mark.parametrize("fields, path, value", [
    ({"replicas": 100}, "spec.replicas", 100),
    ({"replicas": 2, "max_replicas": 200}, "spec.elasticPolicy.maxReplicas", 200),
    ({"replicas": None, "min_replicas": 65}, "spec.elasticPolicy.minReplicas", 65),
])
def test_a_job_above_the_operators_max_replicas_is_invalid_and_nothing_is_rendered(fields, path, value):
    job = make_ddpjob(**fields)
    result = step(job, [], 0, max_replicas=64)
    message = f"{path} ({value}) must be <= 64, the operator's --max-replicas setting"
    invalid = next(c for c in result.status["conditions"] if c["type"] == C.COND_INVALID_SPEC)
    assert (invalid["status"], invalid["message"]) == ("True", message)
    assert result.actions == [] and Event("Warning", "InvalidSpec", message) in result.events


def test_a_job_above_the_crds_maximum_is_reported_by_that_rule_alone():
    result = step(make_ddpjob(replicas=100000), [], 0, max_replicas=64)
    invalid = next(c for c in result.status["conditions"] if c["type"] == C.COND_INVALID_SPEC)
    assert invalid["message"] == "spec.replicas (100000) must be <= 1000"


def test_the_invalid_spec_message_names_a_misspelt_field_and_the_cap_together():
    job = make_ddpjob(replicas=100)
    job["spec"]["imag"] = "x"
    invalid = next(c for c in step(job, [], 0, max_replicas=64).status["conditions"]
                   if c["type"] == C.COND_INVALID_SPEC)
    assert invalid["message"] == ("spec.imag (\"x\") is not a field of this object: did you mean 'image'?; "
                                  "spec.replicas (100) must be <= 64, the operator's --max-replicas setting")


def test_a_job_at_the_operators_max_replicas_is_created():
    job = make_ddpjob(replicas=8, max_replicas=8, **STORE_ON_NODE)
    assert len([a for a in step(job, [], 0, max_replicas=8).actions if isinstance(a, CreatePod)]) == 8


def test_a_large_job_is_created_in_batches_with_a_short_requeue_between_them():
    job = make_ddpjob(replicas=250, **STORE_ON_NODE)
    pods: list[dict] = []
    batches = []
    for seconds in range(4):
        actions = step(job, pods, seconds).actions
        new = [a for a in actions if isinstance(a, CreatePod)]
        batches.append((len(new), [a.after for a in actions if isinstance(a, Requeue)]))
        pods += [make_pod(job, int(a.body["metadata"]["labels"][C.LABEL_NODE_INDEX]), phase="Pending") for a in new]
    assert batches == [(100, [creation.BATCH_REQUEUE_SECONDS]), (100, [creation.BATCH_REQUEUE_SECONDS]),
                       (50, []), (0, [])]
    assert sorted(int(p["metadata"]["labels"][C.LABEL_NODE_INDEX]) for p in pods) == list(range(250))
