"""The fault proxy (control_plane.proxy) on its own: bytes pass unchanged, latency delays them,
drop() cuts open connections, lose_responses() lets a request through and loses its answer,
refusing() and the connection bound refuse; and TLS to the real API server passes through it
with the client's own identity."""
from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from ddpjob_sandbox.client import KubeClient
from ddpjob_sandbox.control_plane import ControlPlane, audit
from ddpjob_sandbox.control_plane.proxy import FaultProxy
from tests.cluster.sandbox_only import AUDIT_LOG


class Echo:
    """A TCP server answering each chunk with itself, remembering what it received."""

    def __init__(self):
        self.server = socket.create_server(("127.0.0.1", 0))
        self.received: list[bytes] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    @property
    def address(self) -> tuple[str, int]:
        return self.server.getsockname()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.server.accept()
                threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    def _echo(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            while data := conn.recv(4096):
                self.received.append(data)
                conn.sendall(data)


@pytest.fixture
def echo() -> Iterator[Echo]:
    server = Echo()
    yield server
    server.server.close()


@pytest.fixture
def proxy(echo: Echo) -> Iterator[FaultProxy]:
    with FaultProxy(echo.address, max_connections=2) as running:
        yield running


def connect(proxy: FaultProxy) -> socket.socket:
    return socket.create_connection(("127.0.0.1", proxy.port), timeout=5)


def round_trip(conn: socket.socket, data: bytes) -> bytes:
    conn.sendall(data)
    return conn.recv(4096)


def test_bytes_pass_unchanged_both_ways(proxy: FaultProxy, echo: Echo):
    with connect(proxy) as conn:
        assert round_trip(conn, b"hello") == b"hello"
        assert round_trip(conn, b"again") == b"again"
    assert echo.received == [b"hello", b"again"]


def test_latency_delays_each_chunk_each_way(proxy: FaultProxy):
    with connect(proxy) as conn:
        assert round_trip(conn, b"warm") == b"warm"
        proxy.latency = 0.3
        started = time.monotonic()
        assert round_trip(conn, b"slow") == b"slow"
        assert time.monotonic() - started >= 0.6, "0.3 s up, 0.3 s down"
        proxy.latency = 0.0
        started = time.monotonic()
        assert round_trip(conn, b"fast") == b"fast"
        assert time.monotonic() - started < 0.3


def test_drop_cuts_every_open_connection_and_new_ones_work(proxy: FaultProxy):
    with connect(proxy) as first, connect(proxy) as second:
        assert round_trip(first, b"1") == b"1" and round_trip(second, b"2") == b"2"
        assert proxy.drop() == 2
        assert [_reset_or_eof(conn) in ("reset", "eof") for conn in (first, second)] == [True, True]
    assert proxy.stats.cut == 2
    with connect(proxy) as third:
        assert round_trip(third, b"3") == b"3"


def _reset_or_eof(conn: socket.socket) -> str:
    """What the client of a cut connection sees: a reset, or (the RST raced a read) the end."""
    try:
        return "eof" if conn.recv(10) == b"" else "data"
    except ConnectionResetError:
        return "reset"


def test_a_lost_response_reached_the_server_and_its_connection_is_cut(proxy: FaultProxy, echo: Echo):
    with connect(proxy) as conn:
        # The first two chunks a client sends stand for the TLS handshake: never lost.
        assert round_trip(conn, b"hello-1") == b"hello-1"
        assert round_trip(conn, b"hello-2") == b"hello-2"
        proxy.lose_responses(1)
        time.sleep(0.1)  # the command reaches the proxy's loop
        conn.sendall(b"request")
        assert _reset_or_eof(conn) in ("reset", "eof")
    assert echo.received[-1] == b"request", "the server got it"
    assert proxy.stats.lost_responses == 1
    with connect(proxy) as conn:
        for i in range(3):
            assert round_trip(conn, b"%d" % i) == b"%d" % i, "one loss only"


def test_connections_over_the_bound_and_while_refusing_are_closed_at_once(proxy: FaultProxy):
    with connect(proxy) as first, connect(proxy) as second:
        assert round_trip(first, b"1") == b"1" and round_trip(second, b"2") == b"2"
        with connect(proxy) as third:
            assert _reset_or_eof(third) in ("reset", "eof")
    assert proxy.stats.refused == 1
    proxy_wait_idle(proxy)
    with proxy.refusing(), connect(proxy) as refused:
        assert _reset_or_eof(refused) in ("reset", "eof")
    with connect(proxy) as again:
        assert round_trip(again, b"back") == b"back"
    assert (proxy.stats.refused, proxy.stats.peak_open) == (2, 2)


def proxy_wait_idle(proxy: FaultProxy) -> None:
    deadline = time.monotonic() + 5
    while proxy.open_connections() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proxy.open_connections() == 0


@pytest.mark.parametrize("field", ["max_connections", "chunk_bytes", "queue_chunks"])
def test_a_bound_below_one_is_refused_naming_it(field: str):
    with pytest.raises(ValueError, match=f"FaultProxy {field} \\(0\\) must be >= 1"):
        FaultProxy(("127.0.0.1", 1), **{field: 0})


@pytest.mark.cluster
@pytest.mark.sandbox_only(AUDIT_LOG)
def test_tls_to_the_api_server_passes_through_with_the_clients_own_identity(control_plane: ControlPlane,
                                                                             kube: KubeClient):
    start = audit.mark(control_plane.layout.audit_log)
    with FaultProxy(("127.0.0.1", control_plane.layout.ports.apiserver)) as proxy:
        through = KubeClient(proxy.url, kube.kubeconfig, kube.namespace, ssl_context=kube.ssl_context)
        through.create("configmaps", {"metadata": {"name": "proxied"}})
        assert kube.get("configmaps", "proxied")["metadata"]["name"] == "proxied"
        assert proxy.stats.accepted >= 1
    created = kube.wait_for(lambda: [r for r in audit.requests(control_plane.layout.audit_log, start)
                                     if (r.verb, r.name, r.namespace) == ("create", "proxied", kube.namespace)],
                            timeout=10, what="the proxied create in the audit log")
    assert [r.user for r in created] == ["ddpjob-admin"]
