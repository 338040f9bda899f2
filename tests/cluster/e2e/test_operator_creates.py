"""Creates the API server refuses are visible and backed off; a job's size is capped by the operator.

The helm-installed operator on the real control plane. The refusals are the real API server's:
a ResourceQuota whose status says it is spent (403 Forbidden, from the ResourceQuota admission
plugin) and a ValidatingAdmissionPolicy (422 Invalid); a throttled create (429 with Retry-After) is
test_operator_throttled.py's. Every create the operator sends, admitted or refused, is counted
from the API server's audit log.
"""
from __future__ import annotations

import contextlib
import datetime

import pytest

from ddpjob_operator.api import constants as C
from ddpjob_sandbox.client import ApiError, KubeClient
from ddpjob_sandbox.control_plane import ControlPlane
from ddpjob_sandbox.control_plane.admission import refused_dry_run
from ddpjob_sandbox.readers import condition, events, pod_names, status
from tests.cluster.installed_operator import pod_creates
from tests.cluster.operators import status_manifest

pytestmark = pytest.mark.cluster

STORE_ON_NODE = {"elasticPolicy": {"rdzvStore": "node"}}  # node pods only: the first create is <job>-node-0
QUOTA = "gpu-quota"
ADMISSION = "/apis/admissionregistration.k8s.io/v1"
POLICY_MESSAGE = "spec.containers[0].resources.requests[cpu]: must be less than or equal to cpu limit"


def quota_message(pod: str) -> str:
    return (f'creating Pod {pod} failed (HTTP 403 Forbidden): pods "{pod}" is forbidden: '
            f"exceeded quota: {QUOTA}, requested: pods=1, used: pods=4, limited: pods=4; "
            "the operator retries with a growing delay")


@contextlib.contextmanager
def spent_quota(kube: KubeClient):
    """A ResourceQuota of 4 pods, all used: the API server refuses every pod create in the
    namespace. Its status is written here (this control plane runs no resource-quota controller to
    count the pods); admission reads it as it would a counted one."""
    path = kube.path("pods").replace("/pods", "/resourcequotas")
    kube.request("POST", path, {"metadata": {"name": QUOTA}, "spec": {"hard": {"pods": "4"}}})
    try:
        kube.request("PUT", f"{path}/{QUOTA}/status", {
            **kube.request("GET", f"{path}/{QUOTA}"), "status": {"hard": {"pods": "4"}, "used": {"pods": "4"}}})
        kube.wait_for(lambda: refused_dry_run(kube) == 403, timeout=30, what="the quota enforced")
        yield lambda: kube.request("DELETE", f"{path}/{QUOTA}")
    finally:
        with contextlib.suppress(ApiError):
            kube.request("DELETE", f"{path}/{QUOTA}")


@contextlib.contextmanager
def refusing_policy(kube: KubeClient, job: str):
    """A ValidatingAdmissionPolicy that refuses the pods of ``job`` in the namespace as invalid
    (422), as a cluster's own policy on pod resources would; the yielded function lifts it."""
    name = f"refuse-{job}"
    kube.request("POST", f"{ADMISSION}/validatingadmissionpolicies", {
        "metadata": {"name": name}, "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                                                    "resources": ["pods"]}]},
            "validations": [{"expression": f"!has(object.metadata.labels) || "
                                          f"object.metadata.labels[?'{C.LABEL_JOB_NAME}'].orValue('') != '{job}'",
                             "message": POLICY_MESSAGE, "reason": "Invalid"}]}})
    binding = {"metadata": {"name": name}, "spec": {
        "policyName": name, "validationActions": ["Deny"],
        "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": kube.namespace}}}}}
    kube.request("POST", f"{ADMISSION}/validatingadmissionpolicybindings", binding)

    def lift():
        for kind in ("validatingadmissionpolicybindings", "validatingadmissionpolicies"):
            with contextlib.suppress(ApiError):
                kube.request("DELETE", f"{ADMISSION}/{kind}/{name}")
    try:
        kube.wait_for(lambda: refused_dry_run(kube, {C.LABEL_JOB_NAME: job}) == 422, timeout=30,
                      what="the policy enforced")
        yield lift
    finally:
        lift()


def create_events(kube, job) -> list[tuple[str, str, str]]:
    return [e for e in events(kube, job) if e[1] in (C.REASON_POD_CREATE_FAILED, C.REASON_CREATES_SUCCEED)]


def attempts(control_plane: ControlPlane, kube, job: str) -> list[tuple[float, str]]:
    """When the API server received each create of the job's pods (seconds since the epoch), and of which pod."""
    return [(datetime.datetime.fromisoformat(e["requestReceivedTimestamp"].replace("Z", "+00:00")).timestamp(),
             e["objectRef"]["name"]) for e in pod_creates(control_plane, kube.namespace, f"{job}-")]


def attempt_times(control_plane: ControlPlane, kube, job: str) -> list[float]:
    return [t for t, _ in attempts(control_plane, kube, job)]


ROUND_SECONDS = 1.0  # creates closer than this belong to one round (the pass of the create and the next one)


def rounds(times: list[float]) -> list[float]:
    """The start of each round of creates."""
    starts: list[float] = []
    for t in times:
        if not starts or t - starts[-1] >= ROUND_SECONDS:
            starts.append(t)
    return starts


def test_a_quota_refusal_shows_a_condition_and_one_event_and_its_retries_back_off(operator, control_plane):
    kube, job = operator.kube, operator.job
    with spent_quota(kube) as raise_quota:
        kube.create("ddpjobs", status_manifest(job, replicas=2, **STORE_ON_NODE))
        kube.wait_for(lambda: condition(kube, C.COND_POD_CREATE_FAILED, job), timeout=20, what="PodCreateFailed")
        refused = condition(kube, C.COND_POD_CREATE_FAILED, job)
        assert (refused["status"], refused["reason"], refused["message"]) == (
            "True", "Forbidden", quota_message(f"{job}-node-0"))
        # Rounds 2 s, 4 s, then 8 s apart: the fourth proves the delay grows (a fixed 2 s retry
        # would have sent three creates in the 6 s after the third).
        starts = kube.wait_for(lambda: len(r := rounds(attempt_times(control_plane, kube, job))) >= 4 and r,
                               timeout=40, interval=0.5, what="four refused create rounds (2 s, 4 s, 8 s)")
        gaps = [b - a for a, b in zip(starts, starts[1:])]
        assert gaps[2] >= 6 and gaps[2] > gaps[1] > gaps[0] * 1.5, (gaps, attempts(control_plane, kube, job))
        assert create_events(kube, job) == [("Warning", C.REASON_POD_CREATE_FAILED, quota_message(f"{job}-node-0"))]
        assert status(kube, job)["phase"] == C.PHASE_PENDING and pod_names(kube, job) == []

        raise_quota()  # the quota was raised, and the job edited
        kube.patch("ddpjobs", job, {"spec": {"args": ["--epochs", "3"]}})
        kube.wait_for(lambda: pod_names(kube, job) == [f"{job}-node-0", f"{job}-node-1"], timeout=10,
                      what="an edited job to create at once, not after its backoff")
    kube.wait_for(lambda: condition(kube, C.COND_POD_CREATE_FAILED, job)["status"] == "False", timeout=10,
                  what="PodCreateFailed to clear")
    kube.wait_for(lambda: len(create_events(kube, job)) == 2, timeout=10, what="the Normal Event")
    assert create_events(kube, job)[1] == ("Normal", C.REASON_CREATES_SUCCEED, C.MSG_CREATES_SUCCEED)


def test_an_invalid_pod_shows_the_apis_message_and_clears_once_a_retry_succeeds(operator):
    kube, job = operator.kube, operator.job
    with refusing_policy(kube, job) as lift:
        kube.create("ddpjobs", status_manifest(job, replicas=2, **STORE_ON_NODE))
        kube.wait_for(lambda: condition(kube, C.COND_POD_CREATE_FAILED, job), timeout=20, what="PodCreateFailed")
        refused = condition(kube, C.COND_POD_CREATE_FAILED, job)
        assert (refused["status"], refused["reason"]) == ("True", "Invalid")
        assert f"creating Pod {job}-node-0 failed (HTTP 422 Invalid)" in refused["message"]
        assert POLICY_MESSAGE in refused["message"], refused["message"]
        lift()  # e.g. the cluster's policy was fixed: no edit of the job
        kube.wait_for(lambda: len(pod_names(kube, job)) == 2, timeout=30, what="the retry after the backoff")
    kube.wait_for(lambda: condition(kube, C.COND_POD_CREATE_FAILED, job)["status"] == "False", timeout=10,
                  what="PodCreateFailed to clear")
    # The pass writes the cleared condition first, then posts its Event.
    kube.wait_for(lambda: len(create_events(kube, job)) == 2, timeout=10, what="the Normal Event")
    assert [e[:2] for e in create_events(kube, job)] == [("Warning", C.REASON_POD_CREATE_FAILED),
                                                         ("Normal", C.REASON_CREATES_SUCCEED)]


def test_a_jobs_backoff_does_not_delay_another_job(operator, control_plane):
    kube, refused, other = operator.kube, operator.name("refused"), operator.name("other")
    with spent_quota(kube):
        kube.create("ddpjobs", status_manifest(refused, replicas=1, **STORE_ON_NODE))
        kube.wait_for(lambda: len(rounds(attempt_times(control_plane, kube, refused))) >= 3, timeout=20, interval=0.5,
                      what="three refused rounds of the first job")
        kube.create("ddpjobs", status_manifest(other, replicas=1, **STORE_ON_NODE))
        # The quota refuses the second job too, but its first attempt and report come at once.
        kube.wait_for(lambda: condition(kube, C.COND_POD_CREATE_FAILED, other), timeout=5,
                      what="the other job's own first attempt")


@pytest.mark.operator_args("--max-replicas", "4")
def test_a_job_above_the_operators_max_replicas_is_refused_with_invalid_spec(operator, control_plane):
    kube, big, fits = operator.kube, operator.name("big"), operator.name("fits")
    kube.create("ddpjobs", status_manifest(big, replicas=5, **STORE_ON_NODE))
    kube.create("ddpjobs", status_manifest(fits, replicas=4, **STORE_ON_NODE))
    kube.wait_for(lambda: condition(kube, C.COND_INVALID_SPEC, big), timeout=20, what="InvalidSpec")
    assert condition(kube, C.COND_INVALID_SPEC, big)["message"] == (
        "spec.replicas (5) must be <= 4, the operator's --max-replicas setting")
    kube.wait_for(lambda: len(pod_names(kube, fits)) == 4, timeout=20, what="the job that fits")
    assert pod_names(kube, big) == [] and len(attempt_times(control_plane, kube, big)) == 0
    assert len(attempt_times(control_plane, kube, fits)) == 4
