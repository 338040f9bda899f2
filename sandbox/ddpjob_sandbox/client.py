"""Talking to the API server over HTTP, as a test or benchmark does.

:class:`KubeClient` is a small synchronous client on http.client: nothing is shared with the
operator's own client, so a test sees the API as any other client does. ``kubectl`` runs
against the same server through the cluster's kubeconfig.

Each thread keeps one connection open, as client-go and kubectl do: a new TLS connection per
request (with a client certificate to verify) cost the API server and the tests more CPU than
the requests themselves, at the kubelets' and the tests' polling rates.
"""
from __future__ import annotations

import http.client
import json
import pathlib
import ssl
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

from ddpjob_sandbox.binaries import DEFAULT_BIN_DIR

# A connection idle this long is closed before the next request rather than reused: well under the
# API server's own idle timeout (Go's http.Server: 90 s), so the server never closes one under us
# except when it stops.
IDLE_SECONDS = 30.0

# Resource name -> (API path prefix, namespaced). Only what the tests use.
RESOURCES: dict[str, tuple[str, bool]] = {
    "pods": ("/api/v1", True),
    "services": ("/api/v1", True),
    "events": ("/api/v1", True),
    "configmaps": ("/api/v1", True),
    "serviceaccounts": ("/api/v1", True),
    "namespaces": ("/api/v1", False),
    "nodes": ("/api/v1", False),
    "persistentvolumes": ("/api/v1", False),
    "persistentvolumeclaims": ("/api/v1", True),
    "secrets": ("/api/v1", True),
    "deployments": ("/apis/apps/v1", True),
    "leases": ("/apis/coordination.k8s.io/v1", True),
    "events.k8s.io": ("/apis/events.k8s.io/v1", True),
    "ddpjobs": ("/apis/ddpjob.io/v1alpha1", True),
    "networkpolicies": ("/apis/networking.k8s.io/v1", True),
    "poddisruptionbudgets": ("/apis/policy/v1", True),
    "customresourcedefinitions": ("/apis/apiextensions.k8s.io/v1", False),
    "kopfpeerings": ("/apis/kopf.dev/v1", True),
    "roles": ("/apis/rbac.authorization.k8s.io/v1", True),
}


class ApiError(Exception):
    """An API call answered with an HTTP error; ``status`` and the ``Status`` body are kept."""

    def __init__(self, status: int, body: Any, what: str):
        self.status = status
        self.body = body
        reason = body.get("reason") if isinstance(body, dict) else None
        message = body.get("message") if isinstance(body, dict) else body
        super().__init__(f"{what} -> HTTP {status} {reason}: {message}")


class KubeClient:
    """A small synchronous API client for tests (urllib; nothing shared with the operator)."""

    def __init__(self, url: str, kubeconfig: pathlib.Path, namespace: str = "default",
                 ssl_context: ssl.SSLContext | None = None, kubectl: str = str(DEFAULT_BIN_DIR / "kubectl"),
                 bearer: Callable[[], str | None] | None = None):
        self.url = url.rstrip("/")
        self.kubeconfig = kubeconfig
        self.namespace = namespace
        # A real API server serves TLS only and knows the client by its certificate.
        self.ssl_context = ssl_context
        # The pinned release's kubectl (.cluster/bin/), of the control plane's own version.
        self.kubectl_binary = kubectl
        # A cluster that logs users in by token (a ServiceAccount's, an exec plugin's): asked for at
        # every request, so one that expires mid-session is renewed (control_plane.external).
        self.bearer = bearer
        self._target = urllib.parse.urlsplit(self.url)
        self._local = threading.local()  # this thread's kept connection and when it was last used

    def path(self, resource: str, name: str | None = None, namespace: str | None = None,
             subresource: str | None = None) -> str:
        prefix, namespaced = RESOURCES[resource]
        plural = resource.split(".")[0] if "." in resource else resource
        parts = [prefix]
        if namespaced:
            parts += ["namespaces", namespace or self.namespace]
        parts.append(plural)
        if name:
            parts.append(name)
        if subresource:
            parts.append(subresource)
        return "/".join(parts)

    def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
                params: Mapping[str, str] | None = None, timeout: float = 10,
                headers: Mapping[str, str] | None = None) -> Any:
        """``headers``: further request headers, e.g. ``Impersonate-User`` to ask as another user."""
        target = self._target.path + path + ("?" + urllib.parse.urlencode(params) if params else "")
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": content_type, **(headers or {})}
        token = self.bearer() if self.bearer else None
        if token:
            headers["Authorization"] = f"Bearer {token}"
        status, raw = self._exchange(method, target, data, headers, timeout)
        if status >= 400:
            try:
                payload = json.loads(raw)
            except ValueError:
                payload = raw.decode(errors="replace")
            raise ApiError(status, payload, f"{method} {path}")
        return json.loads(raw) if raw else None

    def _exchange(self, method: str, target: str, data: bytes | None, headers: dict[str, str],
                  timeout: float) -> tuple[int, bytes]:
        """Sends one request on this thread's kept connection; returns (status, body).

        Only a kept connection that the server closed before answering (it stopped, or a proxy cut
        it) is retried, once, on a new connection: the request never reached the server. Every
        other failure, a new connection's included, is raised as the OSError it is."""
        for _ in range(2):  # the second try is on a new connection: _close() dropped the kept one
            connection, reused = self._connection(timeout)
            try:
                connection.request(method, target, body=data, headers=headers)
                response = connection.getresponse()
                raw = response.read()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self._close()
                if reused:
                    continue
                raise
            except http.client.HTTPException as e:  # a malformed or cut answer: the connection is spoilt
                self._close()
                raise ConnectionError(f"{method} {target}: {e!r}") from e
            except BaseException:
                self._close()
                raise
            if response.will_close:
                self._close()
            else:
                self._local.last_used = time.monotonic()
            return response.status, raw
        raise AssertionError("unreachable: the second try is on a new connection")

    def _connection(self, timeout: float) -> tuple[http.client.HTTPConnection, bool]:
        """This thread's connection (reused: True), or a new one where it has none or it idled
        past IDLE_SECONDS."""
        connection = getattr(self._local, "connection", None)
        if connection is not None and time.monotonic() - self._local.last_used > IDLE_SECONDS:
            self._close()
            connection = None
        reused = connection is not None
        if connection is None:
            host, port = self._target.hostname, self._target.port
            if self._target.scheme == "https":
                connection = http.client.HTTPSConnection(host, port, timeout=timeout, context=self.ssl_context)
            else:
                connection = http.client.HTTPConnection(host, port, timeout=timeout)
            self._local.connection = connection
        connection.timeout = timeout
        if connection.sock is not None:
            connection.sock.settimeout(timeout)
        return connection, reused

    def _close(self) -> None:
        connection = getattr(self._local, "connection", None)
        if connection is not None:
            connection.close()
            self._local.connection = None

    def create(self, resource: str, body: Mapping[str, Any], namespace: str | None = None) -> dict:
        return self.request("POST", self.path(resource, namespace=namespace), body)

    def get(self, resource: str, name: str, namespace: str | None = None, subresource: str | None = None) -> dict:
        return self.request("GET", self.path(resource, name, namespace, subresource))

    def find(self, resource: str, name: str, namespace: str | None = None) -> dict | None:
        """The object, or None where it does not exist."""
        try:
            return self.get(resource, name, namespace)
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def list(self, resource: str, namespace: str | None = None, label_selector: str = "",
             field_selector: str = "") -> list[dict]:
        params = {k: v for k, v in {"labelSelector": label_selector, "fieldSelector": field_selector}.items() if v}
        return self.request("GET", self.path(resource, namespace=namespace), params=params)["items"]

    def patch(self, resource: str, name: str, patch: Any, namespace: str | None = None,
              subresource: str | None = None, patch_type: str = "merge") -> dict:
        content_type = {"merge": "application/merge-patch+json", "json": "application/json-patch+json",
                        "strategic": "application/strategic-merge-patch+json"}[patch_type]
        return self.request("PATCH", self.path(resource, name, namespace, subresource), patch, content_type)

    def replace(self, resource: str, name: str, body: Mapping[str, Any], namespace: str | None = None,
                subresource: str | None = None) -> dict:
        return self.request("PUT", self.path(resource, name, namespace, subresource), body)

    def delete(self, resource: str, name: str, namespace: str | None = None, **options: Any) -> dict:
        return self.request("DELETE", self.path(resource, name, namespace), options or None)

    def wait_for(self, predicate: Callable[[], Any], timeout: float = 30, interval: float = 0.05,
                 what: str = "condition") -> Any:
        """Polls ``predicate`` until it returns something truthy; fails the test with ``what`` after ``timeout``."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            last = predicate()
            if last:
                return last
            time.sleep(interval)
        raise AssertionError(f"timed out after {timeout} s waiting for {what}; last value: {last!r}")

    def kubectl(self, *args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
        """Runs kubectl against this client's API server, in its namespace."""
        command = [self.kubectl_binary, "--kubeconfig", str(self.kubeconfig), "--namespace", self.namespace, *args]
        result = subprocess.run(command, capture_output=True, text=True, input=input, timeout=60)
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(command)} exited {result.returncode}:\n{result.stderr}")
        return result
