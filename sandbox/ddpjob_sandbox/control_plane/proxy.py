"""A TCP proxy in front of kube-apiserver that adds latency and drops connections on command:
the faults a controller meets between itself and a real API server (a slow network, a load
balancer or an API server restart cutting requests and watches), without imitating the server.

It passes TLS through untouched: the client still verifies the API server's certificate (issued
for 127.0.0.1, which the proxy also listens on) and logs in with its own token or certificate,
so the API server sees the same client, and the audit log counts it as itself. The price: the
proxy cannot read a request, so it tells a watch from a request only by what it does on the wire.

Bounded throughout: at most ``max_connections`` open (more are closed at once, counted as
refused), each direction of each reads at most ``chunk_bytes`` at a time and holds at most
``queue_chunks`` chunks while they wait out the latency; everything runs on one event loop in
one thread.

    with FaultProxy(("127.0.0.1", apiserver_port)) as proxy:
        proxy.latency = 0.2        # each chunk, either way, arrives 0.2 s later (pipelined)
        proxy.drop()               # cut every open connection now: requests and watches mid-way
        proxy.lose_responses(3)    # the next 3 requests reach the server; their answers never return
        with proxy.refusing():     # the API server unreachable: new connections closed at once
            ...
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
import time
from collections.abc import Iterator

MAX_CONNECTIONS = 64  # an operator holds one per watch plus a small pool; kubectl and helm a few
CHUNK_BYTES = 64 * 1024
QUEUE_CHUNKS = 16  # per direction: at most 1 MiB of one connection waits out the latency
CONNECT_SECONDS = 10.0
STOP_SECONDS = 10.0
# On its way up a connection carries the TLS handshake first (ClientHello, then Finished): the
# third chunk a client sends is the first that can be a request.
HANDSHAKE_CHUNKS = 2


@dataclasses.dataclass
class ProxyStats:
    """What the proxy did, for a test to check that a fault happened."""

    accepted: int = 0
    refused: int = 0  # closed at once: over max_connections, or while refusing
    cut: int = 0  # open connections cut by drop()
    lost_responses: int = 0  # answers discarded by lose_responses(), their connection cut
    peak_open: int = 0


@dataclasses.dataclass(eq=False)
class _Connection:
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter
    up_chunks: int = 0
    lose_next_response: bool = False

    def abort(self) -> None:
        """Cuts both sides at once (RST, not a polite FIN): a request or watch ends mid-way."""
        for writer in (self.client, self.upstream):
            writer.transport.abort()


class FaultProxy:
    """Forwards 127.0.0.1:<port> to ``target`` until stopped; see the module docstring."""

    def __init__(self, target: tuple[str, int], *, max_connections: int = MAX_CONNECTIONS,
                 chunk_bytes: int = CHUNK_BYTES, queue_chunks: int = QUEUE_CHUNKS):
        for name, value in (("max_connections", max_connections), ("chunk_bytes", chunk_bytes),
                            ("queue_chunks", queue_chunks)):
            if value < 1:
                raise ValueError(f"FaultProxy {name} ({value}) must be >= 1")
        self.target = target
        self.max_connections = max_connections
        self.chunk_bytes = chunk_bytes
        self.queue_chunks = queue_chunks
        self.latency = 0.0  # seconds each chunk waits, either way; set it at any time
        self.stats = ProxyStats()
        self.port = 0
        self._refusing = False
        self._lose_budget = 0
        self._open: set[_Connection] = set()
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy", daemon=True)

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> "FaultProxy":
        self._thread.start()
        self._server = self._call(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        """Closes the listener and every connection; the loop's thread ends."""
        async def close() -> None:
            assert self._server is not None
            self._server.close()
            for connection in list(self._open):
                connection.abort()
            await self._server.wait_closed()
        if self._server is not None:
            self._call(close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=STOP_SECONDS)
        self._loop.close()

    def __enter__(self) -> "FaultProxy":
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    # ----------------------------------------------------------------- faults

    def drop(self) -> int:
        """Cuts every open connection now, whatever it is doing; returns how many."""
        def cut() -> int:
            connections = list(self._open)
            self._open.clear()  # dead now, whatever their tasks still have to unwind: not counted open
            for connection in connections:
                connection.abort()
            self.stats.cut += len(connections)
            return len(connections)
        return self._call_soon(cut)

    def lose_responses(self, count: int) -> None:
        """The next ``count`` requests are forwarded and processed, but the first bytes of each
        answer are discarded and its connection cut: the client cannot know whether it happened."""
        self._loop.call_soon_threadsafe(setattr, self, "_lose_budget", count)

    @contextlib.contextmanager
    def refusing(self) -> Iterator[None]:
        """While the block runs, new connections are closed as soon as accepted (open ones are
        left: combine with :meth:`drop` for an API server that is gone)."""
        self._refusing = True
        try:
            yield
        finally:
            self._refusing = False

    def open_connections(self) -> int:
        return self._call_soon(lambda: len(self._open))

    # ----------------------------------------------------------------- the loop

    def _call(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout=STOP_SECONDS)

    def _call_soon(self, function):
        async def run():
            return function()
        return self._call(run())

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        if self._refusing or len(self._open) >= self.max_connections:
            self.stats.refused += 1
            client_writer.transport.abort()
            return
        try:
            upstream_reader, upstream_writer = await asyncio.wait_for(
                asyncio.open_connection(*self.target), CONNECT_SECONDS)
        except (OSError, asyncio.TimeoutError):
            client_writer.transport.abort()
            return
        connection = _Connection(client_writer, upstream_writer)
        self._open.add(connection)
        self.stats.accepted += 1
        self.stats.peak_open = max(self.stats.peak_open, len(self._open))
        try:
            await asyncio.gather(self._pump(client_reader, upstream_writer, connection, up=True),
                                 self._pump(upstream_reader, client_writer, connection, up=False))
        finally:
            self._open.discard(connection)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, connection: _Connection,
                    *, up: bool) -> None:
        """One direction: a reader that stamps each chunk with its due time, a sender that writes
        it then; the bounded queue between them holds the chunks in flight. An end of stream is
        passed on after the chunks before it (a FIN, which ends the other direction too); a
        reset or a cut ends the connection at once."""
        queue: asyncio.Queue = asyncio.Queue(self.queue_chunks)

        async def send() -> None:
            try:
                while (item := await queue.get()) is not None:
                    due, data = item
                    if (delay := due - time.monotonic()) > 0:
                        await asyncio.sleep(delay)
                    if not up and connection.lose_next_response:
                        self.stats.lost_responses += 1
                        connection.abort()
                        break
                    writer.write(data)
                    await writer.drain()
                else:
                    writer.close()  # flushes what is buffered, then FIN
                    return
            except OSError:
                connection.abort()
            # Cut: keep taking chunks so the reader never blocks on a full queue; it sees the end next.
            while await queue.get() is not None:
                pass

        sender = asyncio.ensure_future(send())
        try:
            while data := await reader.read(self.chunk_bytes):
                if up:
                    connection.up_chunks += 1
                    if self._lose_budget > 0 and connection.up_chunks > HANDSHAKE_CHUNKS:
                        self._lose_budget -= 1
                        connection.lose_next_response = True
                await queue.put((time.monotonic() + self.latency, data))
        except OSError:
            connection.abort()
        finally:
            await queue.put(None)
            await sender
