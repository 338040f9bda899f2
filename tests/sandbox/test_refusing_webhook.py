"""The refusing webhook (control_plane/admission.py) on its own, as the API server calls it: over
TLS with the control plane's CA, an AdmissionReview in, the refusal out, every review recorded;
anything that is no review gets a bounded answer that says what is wrong. Its registration on the
real API server, and the Retry-After that reaches a client there: tests/cluster/test_admission.py."""
from __future__ import annotations

import http.client
import json
import ssl
from pathlib import Path

import pytest

from ddpjob_sandbox.control_plane.admission import MAX_REVIEW_BYTES, Refusal, RefusingWebhook
from ddpjob_sandbox.control_plane.pki import make_pki

THROTTLED = Refusal(429, "TooManyRequests", "slow down", retry_after=3)


@pytest.fixture
def webhook(tmp_path: Path):
    pki = make_pki(tmp_path / "pki")
    running = RefusingWebhook(pki, THROTTLED).start()
    try:
        yield running, ssl.create_default_context(cafile=str(pki / "ca.crt"))
    finally:
        running.stop()


def post(webhook, body: bytes, headers: dict | None = None) -> tuple[int, dict]:
    server, context = webhook
    port = int(server.url.split(":")[2].split("/")[0])
    connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
    try:
        connection.request("POST", "/refuse", body, {"Content-Type": "application/json", **(headers or {})})
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def review(uid: str, name: str, dry_run: bool = False) -> bytes:
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": uid, "name": name, "namespace": "ns", "operation": "CREATE", "dryRun": dry_run,
        "object": {"metadata": {"name": name}}}}).encode()


def test_every_review_is_refused_with_its_uid_and_the_status_and_recorded(webhook):
    code, answer = post(webhook, review("u-1", "mlp-node-0"))
    assert code == 200
    assert answer == {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {
        "uid": "u-1", "allowed": False, "status": {"code": 429, "reason": "TooManyRequests", "message": "slow down",
                                                   "details": {"retryAfterSeconds": 3}}}}
    post(webhook, review("u-2", "probe", dry_run=True))
    server, _ = webhook
    assert [(r.name, r.dry_run) for r in server.reviews()] == [("mlp-node-0", False), ("probe", True)]
    assert [r.name for r in server.attempts("mlp-")] == ["mlp-node-0"], "dry runs are no attempts"


def test_a_refusal_without_retry_after_sends_no_details():
    assert Refusal(403, "Forbidden", "no").status() == {"code": 403, "reason": "Forbidden", "message": "no"}


@pytest.mark.parametrize("body, headers, expected", [
    (b"{not json", {}, (400, "the body is not JSON")),
    (b'{"kind": "AdmissionReview"}', {}, (400, "the body must be an AdmissionReview with request.uid")),
    (b"{}", {"Content-Length": str(MAX_REVIEW_BYTES + 1)},
     (413, f"Content-Length ({MAX_REVIEW_BYTES + 1}) must be 1 to {MAX_REVIEW_BYTES} bytes")),
    (b"", {}, (400, f"Content-Length (0) must be 1 to {MAX_REVIEW_BYTES} bytes")),
], ids=["not JSON", "no request", "too long", "empty"])
def test_what_is_no_review_gets_a_400_or_413_saying_why_and_is_not_recorded(webhook, body, headers, expected):
    code, answer = post(webhook, body, headers)
    assert (code, answer["error"][:len(expected[1])]) == expected
    assert webhook[0].reviews() == []


@pytest.mark.parametrize("fields, message", [
    ({"code": 200}, "Refusal.code (200) must be an HTTP error code, 400 to 599"),
    ({"retry_after": 0}, "Refusal.retry_after (0) must be a whole number of seconds >= 1, or None for no Retry-After"),
    ({"retry_after": 2.5},
     "Refusal.retry_after (2.5) must be a whole number of seconds >= 1, or None for no Retry-After"),
], ids=["success code", "zero seconds", "fraction"])
def test_a_refusal_the_api_server_would_not_pass_on_is_refused_naming_field_and_rule(fields, message):
    with pytest.raises(ValueError) as raised:
        Refusal(**{"code": 429, "reason": "TooManyRequests", "message": "m", **fields})
    assert str(raised.value) == message
