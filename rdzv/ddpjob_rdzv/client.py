"""A fail-over connection to an etcd v3 cluster, with TLS, user/password auth and one lease per process.

etcd3 0.12 talks to one endpoint per client. :class:`EtcdConnection` keeps an
ordered list of endpoints and runs every call against the current one; when it
is unreachable the call moves on to the next endpoint (a fresh gRPC channel,
so no reconnect backoff is inherited) until ``read_timeout`` runs out. Errors
that retrying cannot fix (bad credentials, missing permissions) are raised at
once, naming the endpoint and the user.

Nothing here imports torch: the operator deletes a finished job's keys with
this module (see :mod:`.cleanup`); :mod:`.backend` turns these errors into
torch's rendezvous errors.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, TypeVar

from ddpjob_rdzv import _etcd3

logger = logging.getLogger(__name__)

T = TypeVar("T")


class EtcdUnreachableError(ConnectionError):
    """No endpoint answered within ``read_timeout``; the message names every endpoint tried."""


class EtcdAccessError(PermissionError):
    """etcd rejected the credentials or the permissions; retrying cannot help."""

# One RPC may wait this long for an endpoint before the next endpoint is tried.
_ATTEMPT_TIMEOUT_S = 5.0
# Pause between full passes over all endpoints (doubling up to the maximum).
_RETRY_PAUSE_S = 0.2
_MAX_RETRY_PAUSE_S = 1.0
# Short gRPC reconnect backoff: an etcd restart should be noticed within a second, not grpc's 120 s maximum.
_GRPC_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
# etcd3's watch thread opens a new stream the moment its last one failed. While etcd was unreachable,
# every client that had ever watched spun a core in that loop, starting a gRPC thread per try.
_WATCH_REOPEN_PAUSE_S = 0.1
_MAX_WATCH_REOPEN_PAUSE_S = 2.0


@dataclass(frozen=True)
class EtcdSettings:
    """How to reach and authenticate to etcd; built from ``--rdzv_endpoint`` and ``--rdzv_conf``."""

    endpoints: tuple[tuple[str, int], ...]
    ca_cert: str | None = None
    ssl_cert: str | None = None
    ssl_cert_key: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    read_timeout: float = 60.0
    lease_ttl: int = 7200

    @property
    def endpoint_names(self) -> str:
        return ", ".join(f"{host}:{port}" for host, port in self.endpoints)


class EtcdConnection:
    """Runs etcd3 client calls against the first reachable endpoint; owns this process's lease.

    Thread-safe: torch's keep-alive timer thread and the agent's main thread
    share one connection, and calls are serialized by a lock.
    """

    def __init__(self, settings: EtcdSettings) -> None:
        if not settings.endpoints:
            raise ValueError("etcd endpoints must not be empty: pass --rdzv_endpoint=host:port[,host:port...]")
        self.settings = settings
        self._etcd3 = _etcd3.load()
        self._lock = threading.RLock()
        self._index = 0
        self._client = None
        self._lease = None
        self._lease_refreshed_at = 0.0

    def call(self, what: str, operation: Callable[[object], T]) -> T:
        """Returns ``operation(client)``, failing over between endpoints until ``read_timeout`` runs out.

        Args:
            what: a few words naming the operation, for error messages.
            operation: receives an ``etcd3.Etcd3Client``; must be safe to repeat.

        Raises:
            EtcdUnreachableError: no endpoint answered within ``read_timeout``.
            EtcdAccessError: etcd rejected the credentials or the permissions.
        """
        with self._lock:
            deadline = time.monotonic() + self.settings.read_timeout
            pause = _RETRY_PAUSE_S
            failures: dict[str, str] = {}
            while True:
                for _ in self.settings.endpoints:
                    endpoint = self._current_name()
                    try:
                        return operation(self._connected_client(deadline))
                    except Exception as exc:  # noqa: BLE001 - classified below, re-raised when not transient
                        reason = self._transient_reason(exc, endpoint)
                        failures[endpoint] = reason
                        logger.info("etcd %s failed on %s (%s); trying the next endpoint", what, endpoint, reason)
                        self._drop_client()
                        self._index = (self._index + 1) % len(self.settings.endpoints)
                if time.monotonic() + pause >= deadline:
                    raise EtcdUnreachableError(self._unreachable_message(what, failures))
                time.sleep(pause)
                pause = min(pause * 2, _MAX_RETRY_PAUSE_S)

    def lease_id(self, client) -> int:
        """This process's lease (granted on first use, renewed after a third of its TTL or when it expired)."""
        ttl = self.settings.lease_ttl
        now = time.monotonic()
        if self._lease is None or now - self._lease_refreshed_at > ttl / 3:
            alive = False
            if self._lease is not None:
                responses = client.refresh_lease(self._lease.id)
                alive = any(response.TTL > 0 for response in responses)
            if not alive:
                self._lease = client.lease(ttl)
            self._lease_refreshed_at = now
        return self._lease.id

    def close(self) -> None:
        with self._lock:
            self._drop_client()

    def _current_name(self) -> str:
        host, port = self.settings.endpoints[self._index]
        return f"{host}:{port}"

    def _connected_client(self, deadline: float):
        if self._client is None:
            host, port = self.settings.endpoints[self._index]
            s = self.settings
            self._client = self._etcd3.client(
                host=host,
                port=port,
                ca_cert=s.ca_cert,
                cert_cert=s.ssl_cert,
                cert_key=s.ssl_cert_key,
                user=s.username,
                password=s.password,
                timeout=max(0.1, min(_ATTEMPT_TIMEOUT_S, deadline - time.monotonic())),
                grpc_options=_GRPC_OPTIONS,
            )
            if not self._client.uses_secure_channel:
                # grpc refuses call credentials on plaintext channels; etcd3 also sends the token as metadata.
                # Its watcher copied them when the client was built, so it needs the same fix, or every
                # watch with a username fails (and the store falls back to polling).
                self._client.call_credentials = None
                self._client.watcher._credentials = None
            self._client.watcher._watch_stub = PacedWatchStub(self._client.watcher._watch_stub)
        return self._client

    def _drop_client(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def _transient_reason(self, exc: Exception, endpoint: str) -> str:
        """Returns why ``exc`` is worth retrying elsewhere, or raises a clear error when it is not."""
        exceptions = self._etcd3.exceptions
        if isinstance(exc, exceptions.ConnectionFailedError):
            return "unavailable"
        if isinstance(exc, exceptions.ConnectionTimeoutError):
            return "timed out"
        code = getattr(exc, "code", None)
        if not callable(code):
            raise exc
        name = code().name
        details = exc.details() if callable(getattr(exc, "details", None)) else str(exc)
        if name in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):
            return f"{name.lower()}: {details}"
        if name == "UNAUTHENTICATED" and "invalid auth token" in details:
            # etcd forgets simple auth tokens when it restarts; a new client authenticates again.
            return f"auth token expired, re-authenticating: {details}"
        if name == "INVALID_ARGUMENT" and "user name is empty" in details:
            raise EtcdAccessError(
                f"etcd at {endpoint} requires authentication: set rdzv_conf username and password "
                f"(or password_file)"
            ) from exc
        if name == "INVALID_ARGUMENT" and "authentication failed" in details:
            raise EtcdAccessError(
                f"etcd at {endpoint} rejected rdzv_conf username '{self.settings.username}': {details}; "
                f"check the username and password"
            ) from exc
        if name == "FAILED_PRECONDITION" and "authentication is not enabled" in details:
            raise EtcdAccessError(
                f"etcd at {endpoint} has authentication disabled but rdzv_conf username "
                f"'{self.settings.username}' was given: drop username/password or enable auth in etcd"
            ) from exc
        if name == "PERMISSION_DENIED":
            raise EtcdAccessError(
                f"etcd at {endpoint} denied rdzv_conf username '{self.settings.username}': {details}; "
                f"grant it a role with readwrite on the rendezvous key prefix"
            ) from exc
        raise exc

    def _unreachable_message(self, what: str, failures: dict[str, str]) -> str:
        tried = "; ".join(f"{endpoint} ({reason})" for endpoint, reason in failures.items())
        return (
            f"etcd {what} failed: no endpoint of --rdzv_endpoint={self.settings.endpoint_names} answered within "
            f"read_timeout={self.settings.read_timeout:g} s; tried {tried}. Check that etcd is running and "
            f"reachable at these addresses"
        )


class PacedWatchStub:
    """Stands in for the watch stub of an etcd3 client's watcher, whose thread alone calls it.

    A stream is opened at once when the previous one delivered a response (or there was none);
    after a stream that failed without one, the next waits 0.1 s, doubling up to 2 s. So an
    outage costs a watching process one try every 2 s instead of a busy loop, and a watch
    reconnects within 2 s of etcd's return. Once the client is closed, the thread ends quietly.
    """

    def __init__(self, stub) -> None:
        self._stub = stub
        self._pause = 0.0

    def Watch(self, requests, **kwargs):  # noqa: N802 - the gRPC stub's method name
        time.sleep(self._pause)
        self._pause = min(max(self._pause * 2, _WATCH_REOPEN_PAUSE_S), _MAX_WATCH_REOPEN_PAUSE_S)
        try:
            stream = self._stub.Watch(requests, **kwargs)
        except ValueError:  # the client was closed. etcd3's loop has no exit; SystemExit ends a thread silently.
            raise SystemExit from None
        return self._responses(stream)

    def _responses(self, stream):
        for response in stream:
            self._pause = 0.0
            yield response
