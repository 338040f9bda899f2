"""A refusing webhook (ddpjob_sandbox.control_plane.admission) on the real API server: the client
gets the webhook's code, reason and details as the API server's own answer, with the Retry-After
header, only for the pods it is registered for; after the block nothing of it is left.

Every create here is a server-side dry run: nothing is stored, nothing is scheduled.
"""
from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from ddpjob_sandbox.client import ApiError, KubeClient
from ddpjob_sandbox.control_plane.admission import (
    WEBHOOK_CONFIGURATIONS, Refusal, refused_dry_run, refusing_webhook,
)

pytestmark = pytest.mark.cluster

LABELS = {"sandbox.ddpjob.io/refuse": "yes"}
THROTTLED = Refusal(429, "TooManyRequests", "slow down", retry_after=7)


def dry_run_create(kube: KubeClient, name: str, labels: dict) -> tuple[int, str | None, dict]:
    """Status code, Retry-After header and body of the API server's answer to a dry-run pod create."""
    body = {"metadata": {"name": name, "labels": labels}, "spec": {"containers": [{"name": "c", "image": "x"}]}}
    request = urllib.request.Request(f"{kube.url}{kube.path('pods')}?dryRun=All", data=json.dumps(body).encode(),
                                     method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10, context=kube.ssl_context) as response:
            return response.status, response.headers.get("Retry-After"), json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Retry-After"), json.loads(e.read())


def test_the_api_server_answers_with_the_webhooks_refusal_and_retry_after_and_nothing_is_left(kube, control_plane):
    name = f"refuse-{kube.namespace}"
    with refusing_webhook(kube, control_plane.layout.pki, THROTTLED, LABELS, name=name) as webhook:
        code, retry_after, answer = dry_run_create(kube, "refused", LABELS)
        assert (code, retry_after) == (429, "7")
        assert (answer["reason"], answer["details"]["retryAfterSeconds"]) == ("TooManyRequests", 7)
        assert answer["message"] == 'admission webhook "refuse.sandbox.ddpjob.io" denied the request: slow down'
        assert dry_run_create(kube, "unlabelled", {})[0] == 201, "only the pods of the labels are refused"
        assert "refused" in [r.name for r in webhook.reviews()]
        assert "unlabelled" not in [r.name for r in webhook.reviews()]
    assert refused_dry_run(kube, LABELS) is None
    with pytest.raises(ApiError) as gone:
        kube.request("GET", f"{WEBHOOK_CONFIGURATIONS}/{name}")
    assert gone.value.status == 404


def test_a_webhook_without_labels_is_refused_before_it_could_refuse_a_whole_namespace(kube, control_plane):
    with pytest.raises(ValueError, match="refusing_webhook needs labels"):
        with refusing_webhook(kube, control_plane.layout.pki, THROTTLED, {}, name="never"):
            pass
