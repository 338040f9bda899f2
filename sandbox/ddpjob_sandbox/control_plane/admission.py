"""Admission a test sets up on the real API server, and takes down again: a refusal of its choosing.

The API server's own plugins refuse a create with few answers: a spent ResourceQuota says 403
Forbidden, a ValidatingAdmissionPolicy 422 Invalid (its reasons are Forbidden, Invalid,
Unauthorized and RequestEntityTooLarge only). Any other answer, such as the 429 TooManyRequests
with a Retry-After that a busy cluster's rate-limiting webhook gives, comes from a validating
admission webhook: the API server answers the client with the code, reason and details of the
webhook's AdmissionReview response (k8s.io/apiserver pkg/admission/plugin/webhook/errors/
statuserror.go, ToStatusErr, which prefixes the message with 'admission webhook "<webhook>"
denied the request: '), and turns details.retryAfterSeconds into the response's Retry-After
header (pkg/endpoints/handlers/responsewriters/writers.go, ErrorNegotiated).
tests/cluster/test_admission.py pins both on the pinned release.

* :class:`RefusingWebhook` is that webhook, served over HTTPS from the test's own process (its
  certificate for 127.0.0.1 signed by the control plane's CA, which the registration names as
  caBundle). It answers every review with its :class:`Refusal` and records each one (which pod,
  when, whether a dry run), so a test tells when and how often a client tried.
* :func:`refusing_webhook` registers it for the pod CREATEs of one namespace that carry given
  labels (a ValidatingWebhookConfiguration, failurePolicy Fail), waits until the API server
  calls it, and on exit removes the registration and waits until the API server admits those
  pods again: a refusal never outlives its test.
* :func:`refused_dry_run` is the probe both waits use, and any test that sets up admission:
  the code with which the API server refuses a server-side dry run of a pod, or None.
"""
from __future__ import annotations

import base64
import contextlib
import json
import logging
import ssl
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from ddpjob_sandbox.client import ApiError, KubeClient
from ddpjob_sandbox.control_plane.pki import make_serving_cert

log = logging.getLogger(__name__)

WEBHOOK_CONFIGURATIONS = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
REVIEW_VERSION = "admission.k8s.io/v1"
CERT_STEM = "refusing-webhook"  # its certificate and key in the control plane's pki folder
# How long the API server waits for the webhook's answer (the API allows 1-30 s); with
# failurePolicy Fail a webhook that does not answer in time refuses the create with a 500.
TIMEOUT_SECONDS = 5
# An AdmissionReview carries the object (a pod is a few KiB): the API server's own request
# limit is 3 MiB. Anything larger is not a review the API server sent.
MAX_REVIEW_BYTES = 3 * 1024 * 1024
READ_SECONDS = 10  # a connection that sends no complete request in this time is dropped
# The API server calls a configuration (or stops calling it) once its informer has seen the
# change, about a second; a loaded machine takes longer.
ENFORCED_SECONDS = 30


@dataclass(frozen=True)
class Refusal:
    """What the webhook answers: HTTP ``code`` with ``reason`` (a metav1.StatusReason such as
    TooManyRequests) and ``message``; ``retry_after``: the seconds of the Retry-After header (None:
    no header).

    Raises:
        ValueError: a code that is no HTTP error, or a Retry-After that is not a positive whole
            number of seconds (the API server sends no header for those).
    """

    code: int
    reason: str
    message: str
    retry_after: int | None = None

    def __post_init__(self) -> None:
        if not 400 <= self.code <= 599:
            raise ValueError(f"Refusal.code ({self.code}) must be an HTTP error code, 400 to 599")
        if self.retry_after is not None and (not isinstance(self.retry_after, int) or self.retry_after < 1):
            raise ValueError(f"Refusal.retry_after ({self.retry_after!r}) must be a whole number of seconds >= 1, "
                             "or None for no Retry-After")

    def status(self) -> dict[str, Any]:
        """The metav1.Status of the AdmissionReview response."""
        status: dict[str, Any] = {"code": self.code, "reason": self.reason, "message": self.message}
        if self.retry_after is not None:
            status["details"] = {"retryAfterSeconds": self.retry_after}
        return status


@dataclass(frozen=True)
class Review:
    """One review the webhook answered: the object's namespace and name, whether the request was
    a dry run, and when it arrived (``at``: time.monotonic(), ``wall``: time.time())."""

    namespace: str
    name: str
    dry_run: bool
    at: float
    wall: float


class RefusingWebhook:
    """An HTTPS server on a free port of 127.0.0.1 that refuses every AdmissionReview with ``refusal``.

    Args:
        pki: the control plane's certificate folder (ControlPlane.layout.pki): its CA signs the
            server's certificate, and is what the API server checks it against.
        refusal: the answer to every review.
    """

    def __init__(self, pki: Path, refusal: Refusal):
        self.refusal = refusal
        self.ca_bundle = base64.b64encode((pki / "ca.crt").read_bytes()).decode()
        self._reviews: list[Review] = []
        self._lock = threading.Lock()
        cert, key = make_serving_cert(pki, CERT_STEM, ("IP:127.0.0.1",))
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        # The handshake happens in each connection's own thread (on its first read), so a client
        # that stalls in it holds up neither the accept loop nor the other connections.
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True,
                                                  do_handshake_on_connect=False)
        self.url = f"https://127.0.0.1:{self._server.server_address[1]}/refuse"
        self._thread = threading.Thread(target=self._server.serve_forever, name="refusing-webhook", daemon=True)

    def start(self) -> "RefusingWebhook":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def _record(self, request: Mapping[str, Any]) -> None:
        obj = request.get("object") or {}
        name = request.get("name") or (obj.get("metadata") or {}).get("name") or ""
        review = Review(request.get("namespace") or "", name, bool(request.get("dryRun")), time.monotonic(),
                        time.time())
        with self._lock:
            self._reviews.append(review)

    def reviews(self) -> list[Review]:
        """Every review answered so far, oldest first."""
        with self._lock:
            return list(self._reviews)

    def attempts(self, prefix: str = "") -> list[Review]:
        """The creates (not dry runs) of objects named ``<prefix>*``, oldest first."""
        return [r for r in self.reviews() if not r.dry_run and r.name.startswith(prefix)]

    def answer(self, review: Any) -> tuple[int, dict[str, Any]]:
        """The HTTP status and body that answer a request body: the refusal for an AdmissionReview,
        400 naming what is wrong for anything else."""
        request = review.get("request") if isinstance(review, dict) else None
        if not isinstance(request, dict) or not isinstance(request.get("uid"), str):
            return 400, {"error": "the body must be an AdmissionReview with request.uid"}
        self._record(request)
        return 200, {"apiVersion": REVIEW_VERSION, "kind": "AdmissionReview",
                     "response": {"uid": request["uid"], "allowed": False, "status": self.refusal.status()}}


def _handler_for(webhook: RefusingWebhook) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = READ_SECONDS

        def do_POST(self) -> None:  # noqa: N802 - the name http.server dispatches to
            length = self.headers.get("Content-Length", "")
            if not length.isdigit() or not 0 < int(length) <= MAX_REVIEW_BYTES:
                code = 411 if not length else 413 if length.isdigit() and int(length) > MAX_REVIEW_BYTES else 400
                self._send(code, {"error": f"Content-Length ({length or 'missing'}) must be 1 to {MAX_REVIEW_BYTES} bytes"})
                return
            try:
                review = json.loads(self.rfile.read(int(length)))
            except ValueError as e:
                self._send(400, {"error": f"the body is not JSON: {e}"})
                return
            self._send(*webhook.answer(review))

        def _send(self, code: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
            log.debug("refusing webhook: " + format, *args)

    return Handler


def configuration(name: str, webhook: RefusingWebhook, namespace: str, labels: Mapping[str, str]) -> dict[str, Any]:
    """The ValidatingWebhookConfiguration ``name`` that sends ``webhook`` the pod CREATEs of
    ``namespace`` whose labels include ``labels``, dry runs included (sideEffects None)."""
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [{
                "name": "refuse.sandbox.ddpjob.io",  # a webhook's name must be fully qualified
                "clientConfig": {"url": webhook.url, "caBundle": webhook.ca_bundle},
                "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                           "resources": ["pods"], "scope": "Namespaced"}],
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "objectSelector": {"matchLabels": dict(labels)},
                "failurePolicy": "Fail", "sideEffects": "None", "admissionReviewVersions": ["v1"],
                "timeoutSeconds": TIMEOUT_SECONDS}]}


@contextlib.contextmanager
def refusing_webhook(admin: KubeClient, pki: Path, refusal: Refusal, labels: Mapping[str, str],
                     name: str) -> Iterator[RefusingWebhook]:
    """A :class:`RefusingWebhook` registered as ``name`` for the pod CREATEs in ``admin``'s
    namespace whose labels include ``labels`` (name them narrowly: pods of the test's own job),
    enforced when the block starts and gone, with the API server admitting again, when it ends.

    Args:
        admin: a client that may write ValidatingWebhookConfigurations (the admin's), in the
            namespace whose pods are refused.

    Raises:
        AssertionError: the API server did not start (or stop) refusing within ENFORCED_SECONDS.
    """
    if not labels:
        raise ValueError("refusing_webhook needs labels: without them it refuses every pod of the namespace")
    webhook = RefusingWebhook(pki, refusal).start()
    try:
        admin.request("POST", WEBHOOK_CONFIGURATIONS, configuration(name, webhook, admin.namespace, labels))
        try:
            admin.wait_for(lambda: refused_dry_run(admin, labels) == refusal.code, timeout=ENFORCED_SECONDS,
                           interval=0.2, what=f"webhook {name} refusing pod creates with {refusal.code}")
            yield webhook
        finally:
            with contextlib.suppress(ApiError):  # 404: never created
                admin.request("DELETE", f"{WEBHOOK_CONFIGURATIONS}/{name}")
            # Until the API server has seen the deletion it still calls the webhook, and with the
            # server stopped failurePolicy Fail would refuse the namespace's pods with a 500.
            admin.wait_for(lambda: refused_dry_run(admin, labels) is None, timeout=ENFORCED_SECONDS,
                           interval=0.2, what=f"the API server admitting pods again after webhook {name} is gone")
    finally:
        webhook.stop()


def refused_dry_run(kube: KubeClient, labels: Mapping[str, str] | None = None) -> int | None:
    """The status code with which the API server refuses a probe pod with ``labels`` (server-side
    dry run: nothing is stored), or None when it admits it. The probe meets Pod Security
    `restricted`, so a namespace that enforces it does not refuse it for that."""
    probe = {"metadata": {"name": "probe", "labels": dict(labels or {})}, "spec": {
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "c", "image": "probe", "securityContext": {
            "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}]}}
    try:
        kube.request("POST", kube.path("pods"), probe, params={"dryRun": "All"})
    except ApiError as e:
        return e.status
    return None
