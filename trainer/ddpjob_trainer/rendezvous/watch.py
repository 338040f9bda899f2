"""Hearing at once that a node of the round is gone: a held connection to its liveness beacon.

While a group trains, a node learns of a lost peer only when one of its workers fails on the
lost gloo connection and exits, and exiting (the error report, the process group's teardown,
the interpreter's exit) took ~1.2 s of a ~1.5 s recovery (docs/recovery.md). The peer's
beacon (:mod:`.liveness`) says it sooner: a :class:`BeaconWatch` holds a connection to the
beacon of each peer it is given, and the kernel closes that connection the moment the peer's
agent dies. What the watch reads on it decides:

* closed after the token alone (end of file, or a reset): the agent died without a word,
  **lost** (the cause "beacon closed");
* ``LEAVING``: the agent stops on purpose (a clean finish, a graceful stop, a scale-down):
  not a loss; its workers' own exit tells the group (PeerStopped, stop.py);
* ``FULL``, or anything else: not watched (the group learns as before).

A connection that cannot be made (refused, a timeout, another token) is not watched either:
only a connection that answered this peer's token and was then closed by the kernel counts,
so neither a slow or hostile peer nor a network that drops packets can make a node stop its
workers. Everything is bounded: at most MAX_WATCHED peers, each connected and read within
PROBE_TIMEOUT_SECONDS, a few bytes read per event, one thread; asking (``lost``) never waits.
"""
from __future__ import annotations

import hmac
import logging
import selectors
import socket
import threading
import time
from dataclasses import dataclass

from ddpjob_trainer.rendezvous.liveness import LEAVING, PROBE_TIMEOUT_SECONDS, read_answer

log = logging.getLogger(__name__)

MAX_WATCHED = 64  # peers one node watches (rendezvous/notice.py picks its ring neighbours)
READ_BYTES = 16  # read per event on a held connection: the one byte a beacon may write, and a little more
STOP_SECONDS = 1.0  # how long stop() waits for the thread
LOST = "beacon closed"  # the cause a loss is recorded and logged with


@dataclass(frozen=True)
class Peer:
    """A node to watch: its name (for the log) and where its beacon answers which token."""

    name: str
    addr: str
    port: int
    token: str


class BeaconWatch:
    """Holds a connection to each watched peer's beacon in one thread; ``lost`` lists the peers
    whose beacon closed without LEAVING since the last ``watch``."""

    def __init__(self, timeout: float = PROBE_TIMEOUT_SECONDS) -> None:
        self._timeout = timeout
        self._lock = threading.Lock()
        self._generation = 0  # bumped by each watch(): what the thread learns about older peers is stale
        self._pending: list[Peer] | None = None
        self._lost: list[str] = []
        self._left: list[str] = []
        self._stopped = False
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_read.setblocking(False)
        self._wake_write.setblocking(False)
        self._thread: threading.Thread | None = None

    def watch(self, peers: list[Peer]) -> None:
        """Watches ``peers`` (the first MAX_WATCHED) instead of any before; returns at once."""
        with self._lock:
            if self._stopped:
                return
            self._generation += 1
            self._pending, self._lost, self._left = list(peers[:MAX_WATCHED]), [], []
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="ddpjob-beacon-watch", daemon=True)
                self._thread.start()
        self._wake()

    def forget(self) -> None:
        """Watches nobody (a new round is forming: its peers are not known yet)."""
        self.watch([])

    def lost(self) -> list[str]:
        """The watched peers whose beacon closed without LEAVING (never blocks)."""
        with self._lock:
            return list(self._lost)

    def left(self) -> list[str]:
        """The watched peers that said LEAVING."""
        with self._lock:
            return list(self._left)

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            thread = self._thread
        self._wake()
        if thread is not None:
            thread.join(STOP_SECONDS)
        else:  # never started: the thread would have closed them
            self._wake_read.close()
            self._wake_write.close()

    def _wake(self) -> None:
        try:
            self._wake_write.send(b"x")
        except OSError:  # the buffer is full of wake-ups already, or stopped: the thread wakes anyway
            pass

    # -- the thread ------------------------------------------------------------------------

    def _run(self) -> None:
        held: dict[socket.socket, str] = {}
        with selectors.DefaultSelector() as selector:
            selector.register(self._wake_read, selectors.EVENT_READ)
            try:
                while self._serve_once(selector, held):
                    pass
            finally:
                for connection in held:
                    connection.close()
                self._wake_read.close()
                self._wake_write.close()

    def _serve_once(self, selector: selectors.BaseSelector, held: dict[socket.socket, str]) -> bool:
        with self._lock:
            if self._stopped:
                return False
            pending, self._pending, generation = self._pending, None, self._generation
        if pending is not None:
            for connection in list(held):
                selector.unregister(connection)
                connection.close()
            held.clear()
            for peer in pending:
                if self._generation != generation or self._stopped:
                    break  # a newer set came meanwhile: the next pass connects to that one
                connection = self._connect(peer)
                if connection is not None:
                    held[connection] = peer.name
                    selector.register(connection, selectors.EVENT_READ)
        for key, _ in selector.select():
            if key.fileobj is self._wake_read:
                _drain(self._wake_read)
                continue
            outcome = _ending(key.fileobj)
            if outcome is None:  # woke without anything to read: keep watching
                continue
            name = held.pop(key.fileobj)
            selector.unregister(key.fileobj)
            key.fileobj.close()
            self._record(generation, name, outcome)
        return True

    def _connect(self, peer: Peer) -> socket.socket | None:
        """A connection on which ``peer``'s beacon answered its token; None: not watched."""
        deadline = time.monotonic() + self._timeout
        try:
            connection = socket.create_connection((peer.addr, peer.port), timeout=self._timeout)
        except OSError as error:
            log.debug("not watching %s: its beacon at %s:%d did not answer (%s)", peer.name, peer.addr, peer.port,
                      error)
            return None
        try:
            answer = read_answer(connection, len(peer.token.encode()), deadline)
        except OSError:
            answer = b""
        if not hmac.compare_digest(answer, peer.token.encode()):
            log.debug("not watching %s: no token, or another's, at %s:%d", peer.name, peer.addr, peer.port)
            connection.close()
            return None
        connection.setblocking(False)
        return connection

    def _record(self, generation: int, name: str, outcome: str) -> None:
        with self._lock:
            if generation != self._generation:
                return  # about a round that is over
            if outcome == LOST:
                self._lost.append(name)
            elif outcome == "left":
                self._left.append(name)
        if outcome == "unwatched":
            log.info("stopped watching %s: its beacon is full or wrote something else", name)


def _ending(connection: socket.socket) -> str | None:
    """What a readable held connection says: LOST, "left", "unwatched"; None: nothing yet."""
    try:
        data = connection.recv(READ_BYTES)
    except (BlockingIOError, InterruptedError):
        return None
    except OSError:  # a reset: closed by the kernel as surely as an end of file
        return LOST
    if not data:
        return LOST
    if data.startswith(LEAVING):
        return "left"
    return "unwatched"  # FULL, or not a beacon's word


def _drain(wake: socket.socket) -> None:
    try:
        while wake.recv(64):
            pass
    except OSError:
        pass

