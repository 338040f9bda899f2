"""A create the API server throttles (429 with Retry-After) waits as long as it says, and is
reported only once it persists. Real operator against the API emulator.

Why still the emulator: a real kube-apiserver answers 429 only from its own overload protection
(API Priority and Fairness, max in-flight requests), which cannot be made to refuse one
namespace's pod creates with a chosen Retry-After on demand. Everything else of
test_operator_creates.py runs on the real control plane (tests/cluster/e2e/).
"""
import time

from ddpjob_operator.api import constants as C
from ddpjob_sandbox.emulator import Refusal
from ddpjob_sandbox.jobs import make_manifest
from ddpjob_sandbox.readers import condition

STORE_ON_NODE = {"elasticPolicy": {"rdzvStore": "node"}}  # node pods only: the first create is mlp-node-0


def pod_creates(cluster, k8s) -> int:
    return cluster.emulator.create_attempts[("pods", k8s.namespace)]


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
