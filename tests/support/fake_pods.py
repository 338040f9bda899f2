"""Fake node pods serving progress endpoints, benign or hostile, that count what they send.

Each :class:`FakePod` listens on its own loopback address (127.x.y.z stands in for a pod IP)
and answers every request with its current :class:`Answer`: a valid record, a gzip bomb, a
huge body, a redirect, a trickle. It writes raw HTTP/1.1 so that the hostile answers are
exactly what a hostile pod could send, and keeps a :class:`Exchange` per connection: the
request's headers, the body bytes the kernel accepted (``sent``), whether a write failed
because the client had gone (``cut_short``) and whether the client closed the connection.

The accepted sockets get a small send buffer, so ``sent`` stays close to what the client
actually took (the client's own socket buffer still holds some: see the tests' bounds).
Used by tests/operator/controller/test_live_progress_hostile.py, tests/cluster/e2e/test_operator_live_progress.py
and bench/progress_poll.py.

Not an imitation of a Kubernetes component: these stand in for what runs inside a pod, the
trainer's progress endpoint, so that a test can send what a compromised or broken trainer could
and count, on the sending side, how much the operator read. A pod on the sandbox's kubelets runs
the real trainer, which only answers valid records. On the real control plane a FakePod's address
is a pod's podIP, written into the status of a pod on a status-only Node as its kubelet would.
"""
from __future__ import annotations

import dataclasses
import random
import socket
import socketserver
import threading
import time
import zlib
from collections.abc import Callable, Iterator

SEND_BUFFER_BYTES = 8192  # per accepted socket (Linux doubles it)
PIECE_BYTES = 64 * 1024  # a streamed body is written this much at a time


@dataclasses.dataclass
class Answer:
    """What a fake pod answers: status, headers, and the body as pieces written in turn."""

    status: int = 200
    headers: dict[str, str] = dataclasses.field(default_factory=dict)
    body: Callable[[], Iterator[bytes]] = lambda: iter(())
    pause: float = 0.0  # seconds between pieces (a trickle)


@dataclasses.dataclass
class Exchange:
    """One connection as the fake pod saw it."""

    path: str = ""
    request_headers: dict[str, str] = dataclasses.field(default_factory=dict)
    sent: int = 0  # body bytes the kernel accepted
    cut_short: bool = False  # a write failed: the client had closed the connection
    closed_by_client: bool = False  # after the answer, the client closed (EOF or reset)
    seconds: float = 0.0  # from the request to the end of the exchange
    done: threading.Event = dataclasses.field(default_factory=threading.Event)


def record_answer(body: bytes | str, headers: dict[str, str] | None = None) -> Answer:
    """200 with ``body``, as the trainer serves its record."""
    data = body.encode() if isinstance(body, str) else body
    return Answer(200, {"Content-Type": "application/json", "Content-Length": str(len(data)), **(headers or {})},
                  lambda: iter([data]))


_BOMBS: dict[int, bytes] = {}


def gzip_bomb(expanded_mib: int = 300) -> Answer:
    """A gzip body that expands ~1000-fold (300 MiB of spaces from ~300 KiB), declared as such."""
    if expanded_mib not in _BOMBS:
        packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # wbits 31: the gzip format
        spaces = b" " * (1 << 20)
        _BOMBS[expanded_mib] = b"".join(packer.compress(spaces) for _ in range(expanded_mib)) + packer.flush()
    data = _BOMBS[expanded_mib]
    return Answer(200, {"Content-Type": "application/json", "Content-Encoding": "gzip",
                        "Content-Length": str(len(data))}, lambda: iter([data]))


HUGE_PREFIX = b'{"kind": "ddpjob.progress", "version": 1, "error": "'


def huge_body(size: int, declared: bool) -> Answer:
    """A JSON-looking body of ``size`` bytes, streamed (never held in memory); with
    ``declared`` it carries its Content-Length, without it the body ends when the connection does."""
    def pieces() -> Iterator[bytes]:
        yield HUGE_PREFIX
        piece, left = b"x" * PIECE_BYTES, size - len(HUGE_PREFIX)
        while left > 0:
            yield piece[:left]
            left -= PIECE_BYTES
    headers = {"Content-Type": "application/json"}
    headers.update({"Content-Length": str(size)} if declared else {"Connection": "close"})
    return Answer(200, headers, pieces)


def redirect(location: str) -> Answer:
    return Answer(302, {"Location": location, "Content-Length": "0"})


def trickle(body: bytes | str, every: float = 0.05) -> Answer:
    """A valid answer, one byte every ``every`` seconds."""
    data = body.encode() if isinstance(body, str) else body
    return Answer(200, {"Content-Type": "application/json", "Content-Length": str(len(data))},
                  lambda: (data[i:i + 1] for i in range(len(data))), pause=every)


class FakePod:
    """A node's progress endpoint on its own loopback address, as a pod IP, on ``port``
    (0: any free one; C.PROGRESS_PORT is what rendered pods name, and a trainer elsewhere on
    the machine listening on 0.0.0.0 at that port takes it from every address)."""

    def __init__(self, answer: Answer | None = None, port: int = 0):
        self.ip = f"127.{random.randint(1, 254)}.{random.randint(1, 254)}.{random.randint(1, 254)}"
        self.answer = answer or Answer(404, {"Content-Length": "0"})
        self.exchanges: list[Exchange] = []
        self._server = socketserver.ThreadingTCPServer((self.ip, port), _handler_for(self), bind_and_activate=False)
        self._server.allow_reuse_address = True
        self._server.daemon_threads = True
        self._server.server_bind()
        self._server.server_activate()
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://{self.ip}:{self.port}/progress"

    def finished(self, count: int = 1, timeout: float = 30) -> list[Exchange]:
        """The first ``count`` exchanges, once each has ended (the client closed, or it timed out)."""
        deadline = time.monotonic() + timeout
        while len(self.exchanges) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        for exchange in self.exchanges[:count]:
            exchange.done.wait(max(deadline - time.monotonic(), 0))
        return self.exchanges[:count]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> "FakePod":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _handler_for(pod: FakePod) -> type[socketserver.StreamRequestHandler]:
    class Handler(socketserver.StreamRequestHandler):
        timeout = 10  # a client that neither reads nor closes ends the exchange after this

        def setup(self) -> None:
            self.request.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
            super().setup()

        def handle(self) -> None:
            exchange, started = Exchange(), time.monotonic()
            pod.exchanges.append(exchange)
            try:
                _serve_one(self, pod.answer, exchange)
            finally:
                exchange.seconds = time.monotonic() - started
                exchange.done.set()

    return Handler


def _serve_one(handler: socketserver.StreamRequestHandler, answer: Answer, exchange: Exchange) -> None:
    request_line = handler.rfile.readline().decode("latin-1").split()
    exchange.path = request_line[1] if len(request_line) > 1 else ""
    while (line := handler.rfile.readline().decode("latin-1").strip()):
        name, _, value = line.partition(":")
        exchange.request_headers[name.strip().lower()] = value.strip()
    head = f"HTTP/1.1 {answer.status} Fake\r\n" + "".join(f"{k}: {v}\r\n" for k, v in answer.headers.items()) + "\r\n"
    connection = handler.connection
    try:
        connection.sendall(head.encode())
        for piece in answer.body():
            while piece:  # send(), not sendall(): every byte the kernel took is counted
                taken = connection.send(piece)
                exchange.sent += taken
                piece = piece[taken:]
            if answer.pause:
                time.sleep(answer.pause)
    except (BrokenPipeError, ConnectionResetError):  # the client went away mid-answer
        exchange.cut_short = exchange.closed_by_client = True
        return
    except TimeoutError:  # the client neither reads nor closes
        return
    try:
        exchange.closed_by_client = connection.recv(1) == b""  # the next request, or EOF
    except TimeoutError:
        exchange.closed_by_client = False  # still open after Handler.timeout
    except ConnectionResetError:
        exchange.closed_by_client = True  # closed with unread data: the kernel sent a reset
