"""How a test client logs in to an API server: a CA to trust, a client certificate, a bearer token
(fixed, read from a file, or an exec plugin's), as files and a callable, the shapes ssl and kopf's
ConnectionInfo take. The sandbox's own control plane logs its admin in by certificate
(:meth:`ControlPlane.login`); an external cluster however its kubeconfig says (external.py).
"""
from __future__ import annotations

import datetime
import json
import os
import ssl
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EXEC_API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")
EXEC_TIMEOUT_SECONDS = 60
# A token an exec plugin gave is asked for again this long before it expires, so no request
# carries one that lapses on the way.
EXEC_RENEW_MARGIN = datetime.timedelta(seconds=30)


class LoginError(ValueError):
    """A kubeconfig's login cannot be done as it says (the message names the field and value)."""


@dataclass(frozen=True)
class Login:
    """How to log in to the API server, as files and a token (what ssl and kopf's ConnectionInfo take)."""

    server: str
    ca_file: Path | None = None  # None: the system's trusted CAs
    insecure: bool = False
    certificate_file: Path | None = None
    key_file: Path | None = None
    bearer: ExecToken | StaticToken | None = None

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file else None)
        if self.insecure:  # the kubeconfig's own insecure-skip-tls-verify: true
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if self.certificate_file:
            context.load_cert_chain(str(self.certificate_file), str(self.key_file))
        return context

    def token(self) -> str | None:
        return self.bearer() if self.bearer else None


@dataclass(frozen=True)
class StaticToken:
    """``token``, or ``tokenFile`` read at every call: a projected token file is rewritten when renewed."""

    value: str | None = None
    path: Path | None = None

    def __call__(self) -> str:
        return self.value if self.value is not None else self.path.read_text().strip()


@dataclass
class ExecToken:
    """The token of the user's exec plugin, asked for again shortly before it expires."""

    where: str  # the kubeconfig field, for errors
    spec: dict[str, Any]
    _token: str | None = None
    _expires: datetime.datetime | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self) -> str:
        with self._lock:
            now = datetime.datetime.now(datetime.timezone.utc)
            if self._token is None or (self._expires and now >= self._expires - EXEC_RENEW_MARGIN):
                self._token, self._expires = run_exec_plugin(self.where, self.spec)
            return self._token


def run_exec_plugin(where: str, spec: dict[str, Any]) -> tuple[str, datetime.datetime | None]:
    """Runs a kubeconfig's exec plugin as kubectl does; returns its token and when it expires.

    Raises:
        LoginError: the plugin failed or answered no token.
    """
    api_version = spec.get("apiVersion")
    if api_version not in EXEC_API_VERSIONS:
        raise LoginError(f"{where}.apiVersion ({api_version!r}) must be one of {', '.join(EXEC_API_VERSIONS)}")
    if not spec.get("command"):
        raise LoginError(f"{where}.command must name the plugin to run; it is {spec.get('command')!r}")
    command = [spec["command"], *(spec.get("args") or [])]
    env = {**os.environ, **{e["name"]: e["value"] for e in spec.get("env") or []},
           "KUBERNETES_EXEC_INFO": json.dumps({"apiVersion": api_version, "kind": "ExecCredential",
                                               "spec": {"interactive": False}})}
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=EXEC_TIMEOUT_SECONDS,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise LoginError(f"{where}.command ({spec['command']!r}) could not run: {e}") from None
    if done.returncode:
        raise LoginError(f"{where}.command ({' '.join(command)}) exited with {done.returncode}: "
                         f"{done.stderr.strip()[-2000:]}")
    try:
        status = json.loads(done.stdout)["status"]
        token = status["token"]
    except (ValueError, KeyError, TypeError):
        # Its output is not shown: whatever shape it has, it may hold a credential.
        raise LoginError(f"{where}.command ({' '.join(command)}) must print an ExecCredential with "
                         f"status.token; its {len(done.stdout)} characters of output have none") from None
    expires = status.get("expirationTimestamp")
    return token, datetime.datetime.fromisoformat(expires.replace("Z", "+00:00")) if expires else None

