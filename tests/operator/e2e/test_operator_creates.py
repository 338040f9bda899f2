"""Creates the API refuses are visible and backed off; a job's size is capped by the operator.

Real operator against the API emulator; the emulator refuses pod creates as a ResourceQuota
(403 Forbidden) or an invalid pod (422 Invalid) would, and counts every create it receives.
"""
import time

import pytest

from ddpjob_operator.api import constants as C
from ddpjob_sandbox.emulator import Refusal, quota_refusal
from ddpjob_sandbox.jobs import make_manifest
from ddpjob_sandbox.readers import condition, events, pod_names, status

STORE_ON_NODE = {"elasticPolicy": {"rdzvStore": "node"}}  # node pods only: the first create is mlp-node-0
QUOTA_MESSAGE = ('creating Pod mlp-node-0 failed (HTTP 403 Forbidden): pods "mlp-node-0" is forbidden: '
                 "exceeded quota: gpu-quota, requested: pods=1, used: pods=4, limited: pods=4; "
                 "the operator retries with a growing delay")
INVALID = Refusal(422, "Invalid", 'Pod "{name}" is invalid: spec.containers[0].resources.requests[cpu]: '
                                  'Invalid value: "2": must be less than or equal to cpu limit')


def create_events(k8s) -> list[tuple[str, str, str]]:
    return [e for e in events(k8s) if e[1] in (C.REASON_POD_CREATE_FAILED, C.REASON_CREATES_SUCCEED)]


def pod_creates(cluster, k8s) -> int:
    return cluster.emulator.create_attempts[("pods", k8s.namespace)]


def test_a_quota_refusal_shows_a_condition_and_one_event_and_its_retries_back_off(cluster, k8s, operator):
    cluster.emulator.refuse_creates("pods", k8s.namespace, quota_refusal("gpu-quota", used=4, limit=4))
    k8s.create("ddpjobs", make_manifest(replicas=2, **STORE_ON_NODE))
    k8s.wait_for(lambda: condition(k8s, C.COND_POD_CREATE_FAILED), timeout=20, what="PodCreateFailed")
    refused = condition(k8s, C.COND_POD_CREATE_FAILED)
    assert (refused["status"], refused["reason"], refused["message"]) == ("True", "Forbidden", QUOTA_MESSAGE)
    k8s.wait_for(lambda: pod_creates(cluster, k8s) >= 3, timeout=20, what="three refused create rounds (2 s, 4 s)")
    before = pod_creates(cluster, k8s)
    time.sleep(6)  # the next round is 8 s after the third: a fixed 2 s retry would have sent 3 creates here
    assert pod_creates(cluster, k8s) - before <= 1
    assert create_events(k8s) == [("Warning", C.REASON_POD_CREATE_FAILED, QUOTA_MESSAGE)]
    assert status(k8s)["phase"] == C.PHASE_PENDING and pod_names(k8s) == []

    cluster.emulator.allow_creates("pods", k8s.namespace)  # the quota was raised, and the job edited
    k8s.patch("ddpjobs", "mlp", {"spec": {"args": ["--epochs", "3"]}})
    k8s.wait_for(lambda: pod_names(k8s) == ["mlp-node-0", "mlp-node-1"], timeout=10,
                 what="an edited job to create at once, not after its backoff")
    k8s.wait_for(lambda: condition(k8s, C.COND_POD_CREATE_FAILED)["status"] == "False", timeout=10,
                 what="PodCreateFailed to clear")
    k8s.wait_for(lambda: len(create_events(k8s)) == 2, timeout=10, what="the Normal Event")
    assert create_events(k8s)[1] == ("Normal", C.REASON_CREATES_SUCCEED, C.MSG_CREATES_SUCCEED)


def test_an_invalid_pod_shows_the_apis_message_and_clears_once_a_retry_succeeds(cluster, k8s, operator):
    cluster.emulator.refuse_creates("pods", k8s.namespace, INVALID)
    k8s.create("ddpjobs", make_manifest(replicas=2, **STORE_ON_NODE))
    k8s.wait_for(lambda: condition(k8s, C.COND_POD_CREATE_FAILED), timeout=20, what="PodCreateFailed")
    refused = condition(k8s, C.COND_POD_CREATE_FAILED)
    assert (refused["status"], refused["reason"]) == ("True", "Invalid")
    assert 'Pod "mlp-node-0" is invalid: spec.containers[0].resources.requests[cpu]' in refused["message"]
    cluster.emulator.allow_creates("pods", k8s.namespace)  # e.g. a LimitRange was fixed: no edit of the job
    k8s.wait_for(lambda: len(pod_names(k8s)) == 2, timeout=20, what="the retry after the backoff")
    k8s.wait_for(lambda: condition(k8s, C.COND_POD_CREATE_FAILED)["status"] == "False", timeout=10,
                 what="PodCreateFailed to clear")
    assert [e[:2] for e in create_events(k8s)] == [("Warning", C.REASON_POD_CREATE_FAILED),
                                                   ("Normal", C.REASON_CREATES_SUCCEED)]


def test_a_jobs_backoff_does_not_delay_another_job(cluster, k8s, operator):
    cluster.emulator.refuse_creates("pods", k8s.namespace, quota_refusal())
    k8s.create("ddpjobs", make_manifest(name="refused", replicas=1, **STORE_ON_NODE))
    k8s.wait_for(lambda: pod_creates(cluster, k8s) >= 3, timeout=20, what="three refused rounds of the first job")
    k8s.create("ddpjobs", make_manifest(name="other", replicas=1, **STORE_ON_NODE))
    # The quota refuses the second job too, but its first attempt and report come at once.
    k8s.wait_for(lambda: condition(k8s, C.COND_POD_CREATE_FAILED, job="other"), timeout=5,
                 what="the other job's own first attempt")


def test_a_throttled_create_waits_as_long_as_retry_after_says_and_persisting_shows_the_condition(
        cluster, k8s, operator):
    cluster.emulator.refuse_creates("pods", k8s.namespace,
                                    Refusal(429, "TooManyRequests", "too many requests, please try again later",
                                            retry_after=3))
    k8s.create("ddpjobs", make_manifest(replicas=1, **STORE_ON_NODE))
    times = []
    for count in (1, 2, 3):
        k8s.wait_for(lambda: pod_creates(cluster, k8s) >= count, timeout=20, what=f"create round {count}")
        times.append(time.monotonic())
        if count < 3:  # a throttled create is the server's trouble: not reported before it persists
            assert condition(k8s, C.COND_POD_CREATE_FAILED) is None
    assert times[1] - times[0] >= 2.5 and times[2] - times[1] >= 2.5, "Retry-After (3 s) beats the 2 s and 4 s delays"
    k8s.wait_for(lambda: condition(k8s, C.COND_POD_CREATE_FAILED), timeout=10, what="PodCreateFailed")
    assert condition(k8s, C.COND_POD_CREATE_FAILED)["reason"] == "TooManyRequests"


@pytest.mark.operator_args("--max-replicas", "4")
def test_a_job_above_the_operators_max_replicas_is_refused_with_invalid_spec(cluster, k8s, operator):
    k8s.create("ddpjobs", make_manifest(name="big", replicas=5, **STORE_ON_NODE))
    k8s.create("ddpjobs", make_manifest(name="fits", replicas=4, **STORE_ON_NODE))
    k8s.wait_for(lambda: condition(k8s, C.COND_INVALID_SPEC, job="big"), timeout=20, what="InvalidSpec")
    assert condition(k8s, C.COND_INVALID_SPEC, job="big")["message"] == (
        "spec.replicas (5) must be <= 4, the operator's --max-replicas setting")
    k8s.wait_for(lambda: len(pod_names(k8s, "fits")) == 4, timeout=20, what="the job that fits")
    assert pod_names(k8s, "big") == [] and pod_creates(cluster, k8s) == 4
