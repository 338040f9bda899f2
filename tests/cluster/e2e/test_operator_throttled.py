"""A create the API server throttles (429 TooManyRequests with Retry-After) waits as long as the
server says, and is reported only once it persists.

The helm-installed operator on the real control plane. The throttling is a validating admission
webhook served from this test (ddpjob_sandbox.control_plane.admission says how its answer reaches
the operator as the API server's own 429 and Retry-After header), registered for this test's job's
pods only; it also tells when each create arrived. The other refusals (quota, invalid pod) are
test_operator_creates.py's.
"""
from __future__ import annotations

import datetime

import pytest

from ddpjob_operator.api import constants as C
from ddpjob_sandbox.control_plane.admission import Refusal, refusing_webhook
from ddpjob_sandbox.readers import condition
from tests.cluster.operators import status_manifest

pytestmark = pytest.mark.cluster

STORE_ON_NODE = {"elasticPolicy": {"rdzvStore": "node"}}  # node pods only: every create is <job>-node-0
RETRY_AFTER = 3  # seconds: more than the operator's first create backoff (2 s, controller/backoff.py)
THROTTLED = Refusal(429, "TooManyRequests", "too many requests, please try again later", retry_after=RETRY_AFTER)
# The operator's next create waits RETRY_AFTER from its receipt of the refusal, which follows
# the webhook's receipt of the create; 0.1 s allows for the clocks' resolution, not for load.
EARLIEST_GAP = RETRY_AFTER - 0.1


def seconds(timestamp: str) -> float:
    """An RFC 3339 timestamp of the API (whole seconds, UTC) as seconds since the epoch."""
    return datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def test_a_throttled_create_waits_as_long_as_retry_after_says_and_persisting_shows_the_condition(
        operator, control_plane):
    kube, job = operator.kube, operator.job
    with refusing_webhook(kube, control_plane.layout.pki, THROTTLED, {C.LABEL_JOB_NAME: job},
                          name=f"throttle-{job}") as webhook:
        kube.create("ddpjobs", status_manifest(job, replicas=1, **STORE_ON_NODE))
        for count in (1, 2, 3):
            kube.wait_for(lambda: len(webhook.attempts(f"{job}-")) >= count, timeout=20, interval=0.05,
                          what=f"create round {count}")
            if count < 3:  # a throttled create is the server's trouble: not reported before it persists
                assert condition(kube, C.COND_POD_CREATE_FAILED, job) is None
        first, second, third = webhook.attempts(f"{job}-")[:3]
        gaps = [second.at - first.at, third.at - second.at]
        assert min(gaps) >= EARLIEST_GAP, f"a create came sooner than Retry-After ({RETRY_AFTER} s) allows: {gaps}"
        kube.wait_for(lambda: condition(kube, C.COND_POD_CREATE_FAILED, job), timeout=10, what="PodCreateFailed")
    refused = condition(kube, C.COND_POD_CREATE_FAILED, job)
    assert (refused["status"], refused["reason"]) == ("True", "TooManyRequests")
    assert f"creating Pod {job}-node-0 failed (HTTP 429 TooManyRequests)" in refused["message"], refused["message"]
    assert THROTTLED.message in refused["message"], refused["message"]
    # Reported after the third refusal, not the second: that one came RETRY_AFTER seconds
    # earlier, and a report then would carry a transition time before the third's second.
    assert seconds(refused["lastTransitionTime"]) >= int(third.wall), (refused, third)
