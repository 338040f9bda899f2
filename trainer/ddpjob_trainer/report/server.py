"""GET /progress: the node's progress record served over HTTP while the worker runs.

The endpoint is reachable by whatever reaches the pod (the operator polls it,
controller/live_progress.py), so every client is bounded in time and number: one thread, one
event loop, READ_TIMEOUT_SECONDS per exchange, at most MAX_CONNECTIONS open. It serves whatever
bytes the record (record.py) last published; it knows nothing else of the record.
"""
from __future__ import annotations

import asyncio
import logging
import socket
import threading
from collections.abc import Callable

from ddpjob_trainer.listen import listen_host, listening_socket

log = logging.getLogger(__name__)

HTTP_PATH = "/progress"
READ_TIMEOUT_SECONDS = 2.0  # a client of /progress has this long to send its request and read the answer
MAX_CONNECTIONS = 8  # open /progress connections; a new one beyond closes the oldest
MAX_REQUEST_BYTES = 8192  # request line and headers; a GET needs ~100


class ProgressServer:
    """GET /progress on one thread, an event loop, whatever the number of clients.

    The endpoint is reachable by whatever reaches the pod, so a client is not trusted to finish:
    http.server's ThreadingHTTPServer had no timeout and a thread per connection (measured: 50
    half-sent requests held 50 threads, each until its client left). Here each connection has
    READ_TIMEOUT_SECONDS for its whole exchange, and at most MAX_CONNECTIONS are open: a new one
    beyond closes the oldest, so a client that holds connections open delays nobody long (the
    operator's poll gives a pod 2 s, controller/live_progress.py).
    """

    def __init__(self, published: Callable[[], bytes], server: socket.socket):
        self._published = published
        self.port = server.getsockname()[1]
        self._open: dict[asyncio.StreamWriter, None] = {}  # the open connections, oldest first
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, args=(server,), name="ddpjob-progress", daemon=True)
        self._thread.start()

    def _run(self, server: socket.socket) -> None:
        asyncio.set_event_loop(self._loop)
        listening = self._loop.run_until_complete(
            asyncio.start_server(self._connected, sock=server, limit=MAX_REQUEST_BYTES))
        self._loop.run_forever()
        listening.close()
        # Every connection's handler ends here, so none is left pending when the loop closes.
        handlers = asyncio.all_tasks(self._loop)
        for handler in handlers:
            handler.cancel()
        self._loop.run_until_complete(asyncio.gather(*handlers, return_exceptions=True))
        self._loop.close()

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._open) >= MAX_CONNECTIONS:
            oldest = next(iter(self._open))
            del self._open[oldest]
            oldest.transport.abort()  # its handler sees the end of its stream and returns
        self._open[writer] = None
        try:
            await asyncio.wait_for(self._exchange(reader, writer), READ_TIMEOUT_SECONDS)
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            pass  # too slow, gone, or a request over MAX_REQUEST_BYTES: nothing to answer
        finally:
            self._open.pop(writer, None)
            writer.transport.abort()  # a no-op once the answer was sent and the connection closed

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        request = head.split(b"\r\n", 1)[0].split()
        ours = len(request) == 3 and request[0] == b"GET" and request[1] == HTTP_PATH.encode()
        body = self._published() if ours else b""
        status = b"200 OK" if body else b"404 Not Found"
        writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\nContent-Length: "
                     + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
        writer.close()  # after the answer is sent (drain() alone returns while it is still buffered)
        await writer.wait_closed()


def serve(published: Callable[[], bytes], port: int) -> ProgressServer | None:
    """Serves ``published()`` at GET /progress on ``port`` (0: any free port) of $DDPJOB_LISTEN_HOST;
    None, with a warning, when the port is taken (the record still reaches the termination message)."""
    host = listen_host()
    try:
        server = listening_socket(host, port)
    except OSError as error:
        log.warning("not serving training progress on port %d of %s (%s): the operator will learn it only when "
                    "this container exits", port, host or "every interface", error)
        return None
    return ProgressServer(published, server)
