"""Telling a dead node from a late one, without waiting out its keep-alive.

torch's dynamic rendezvous drops a node only when it has missed ``keep_alive_max_attempt``
heartbeats (6 s with the tests' 2 s x 3, 15 s with torch's defaults). After a node loss the
survivors spend most of their pause waiting for exactly that (docs/recovery.md). But the usual
death is a process death on a host that is still up (a SIGKILLed or OOM-killed agent, a
container killed with its pod): then the kernel can say so at once, by refusing connections.

So every agent under ddpjob's rendezvous keeps a *beacon*: a listening socket, closed by the
kernel when the agent dies, that answers each connection with a random token of its own. Its
address, port and token are published in the rendezvous store. A node that has missed a
heartbeat is *probed* at that published address (never by resolving its name: DNS, or a name
another process can claim, must not decide that a node is dead):

* connection refused, or an answer other than its token (the port was freed and taken again,
  by another beacon or another program): the node is **gone**, and is removed from the round
  as keep-alive expiry would have removed it;
* its own token answered: alive, merely late;
* anything else (a timeout, an unreachable host: a lost machine, a pod whose network went
  with it, no beacon or an unreadable one published): **unknown**, and keep-alive expiry
  decides as before.

Only "gone" shortens anything, and it needs a positive answer from the node's host, so a
live node is never dropped. The token tells this agent's beacon from any other listener; it is
not a secret (whoever connects reads it), and a stranger answering with it only makes a node
look alive, which leaves it to keep-alive expiry. Probes cost nothing while every node beats on
time: only late nodes are probed, one that answered at most once a second, one that did not at
most once per keep-alive interval. The exception is a *suspect*, a node whose beacon this node saw
close without a word while they trained (:mod:`.watch`): it is probed once at the next round
without waiting for it to miss a heartbeat, which would keep the survivors waiting up to a
keep-alive interval after the loss (``Liveness.suspect``).

A beacon also tells the nodes of its round that it is gone while they train
(:mod:`.watch`): it keeps each connection open after its token, and a peer that holds one sees
it closed the moment the kernel closes the agent's sockets. An agent that stops on purpose (its
handler's shutdown, or its interpreter exiting, as it does after SIGTERM once its workers
stopped gracefully) first writes ``LEAVING`` on every connection it holds, so only a death
without a word (SIGKILL, an OOM kill, a crash) reads as a loss. It holds at most ``MAX_HELD``
connections; over that it answers ``FULL`` after its token and closes, which a watcher takes as
"not watched", never as a loss. A probe reads the token and closes its end.

The beacon listens on ``DDPJOB_LISTEN_HOST`` (ddpjob_trainer.listen): every interface in a
pod, where peers probe it at the pod's address, loopback in ``ddpjob run``. A loopback address
(``ddpjob run``, or a host name that resolves to 127.0.1.1, as Debian's /etc/hosts has it) names
a listener only within one network namespace: it is published with this agent's (boot id and
namespace inode), and a prober in another one counts it unknown rather than probe its own loopback
and take the refusal for a death.
"""
from __future__ import annotations

import atexit
import hmac
import ipaddress
import json
import logging
import os
import secrets
import selectors
import socket
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
    RendezvousSettings, _NodeDesc, _remove_participant_epilogue, _RendezvousState,
)

from ddpjob_trainer.listen import EVERY_INTERFACE, listen_host, listening_socket

log = logging.getLogger(__name__)

KEY_PREFIX = "ddpjob/liveness/"
# One probe's bound for connecting and for reading the answer; a node whose host does not
# answer within it is "unknown", never "gone".
PROBE_TIMEOUT_SECONDS = 0.5
TOKEN_BYTES = 16  # random bytes of a beacon's token (sent as 32 hex digits)
# A probe reads at most this much: a token, or enough of another answer to know it is not one.
MAX_ANSWER_BYTES = 512
MAX_PUBLISHED_BYTES = 256  # a published {"addr", "port", "token"}; anything longer is not ours
# A late node that answered is probed again at most this often (a waiting node decides several
# times a second, rendezvous/early.py).
ALIVE_RECHECK_SECONDS = 1.0
# What a beacon writes after its token, and only then closes the connection (see the module
# docstring); a connection closed after the token alone was closed by the kernel: the agent died.
LEAVING = b"."  # its agent stops on purpose: not a loss
FULL = b"+"  # it holds MAX_HELD connections already: this one is not watched
# Connections a beacon keeps open at once: a watcher per peer that watches it (rendezvous/watch.py
# watches at most MAX_WATCHED peers) and probes in flight, with room for a few strangers.
MAX_HELD = 256
# How long closing a beacon waits for its thread to have written LEAVING everywhere.
CLOSE_SECONDS = 1.0
ACCEPT_RETRY_SECONDS = 0.05  # after an accept that failed (no file descriptor left)


class Beacon:
    """A socket listening on ``host`` (EVERY_INTERFACE: all) that answers each connection with
    ``token`` and holds it open (up to MAX_HELD) until its client closes it, or until ``close``,
    which writes LEAVING on each first; the kernel refuses new connections, and closes the held
    ones without LEAVING, once the process that holds it is gone.

    ``close`` runs at interpreter exit too: an agent that exits through Python (a clean finish,
    a SIGTERM that torch turns into an exception) says it leaves.
    """

    def __init__(self, token: str, host: str = "") -> None:
        self._answer = token.encode()
        self._socket = listening_socket(host, 0)
        self._socket.setblocking(False)
        self.port = self._socket.getsockname()[1]
        self._wake_read, self._wake_write = socket.socketpair()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="ddpjob-liveness-beacon", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def _serve(self) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self._socket, selectors.EVENT_READ)
            selector.register(self._wake_read, selectors.EVENT_READ)
            held: set[socket.socket] = set()
            while not self._closing.is_set():
                for key, _ in selector.select():
                    if key.fileobj is self._socket:
                        self._accept(selector, held)
                    elif key.fileobj is not self._wake_read:
                        # Its client closed it, or wrote (nobody needs to): either way it is done.
                        _release(selector, held, key.fileobj)
            for connection in held:
                _send_quietly(connection, LEAVING)
                connection.close()
            self._socket.close()
            self._wake_read.close()

    def _accept(self, selector: selectors.BaseSelector, held: set[socket.socket]) -> None:
        while True:
            try:
                connection, _ = self._socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # e.g. out of file descriptors: the pending ones wait a little
                time.sleep(ACCEPT_RETRY_SECONDS)  # the listener stays readable: do not spin on it
                return
            connection.setblocking(False)
            if len(held) >= MAX_HELD:
                _send_quietly(connection, self._answer + FULL)
                connection.close()
                continue
            if not _send_quietly(connection, self._answer):
                connection.close()
                continue
            held.add(connection)
            selector.register(connection, selectors.EVENT_READ)

    def close(self) -> None:
        """Writes LEAVING on every held connection, closes them and stops listening (idempotent)."""
        atexit.unregister(self.close)
        if self._closing.is_set():
            return
        self._closing.set()
        _send_quietly(self._wake_write, b"x")
        self._thread.join(CLOSE_SECONDS)
        self._wake_write.close()
        if self._thread.is_alive():  # never seen; do not leave the port answering for a stopped agent
            log.warning("liveness beacon thread did not stop within %.1f s; closing its socket", CLOSE_SECONDS)
            self._socket.close()


def _release(selector: selectors.BaseSelector, held: set[socket.socket], connection) -> None:
    selector.unregister(connection)
    held.discard(connection)
    connection.close()


def _send_quietly(connection: socket.socket, data: bytes) -> bool:
    """Writes ``data`` without blocking (a few bytes always fit a socket's empty buffer); whether it went."""
    try:
        return connection.send(data) == len(data)
    except OSError:
        return False


def probe(addr: str, port: int, token: str, timeout: float = PROBE_TIMEOUT_SECONDS) -> bool | None:
    """True: the beacon of ``token`` answered at ``addr:port``; False: it is provably gone there
    (refused, or something else answered); None: unknown."""
    try:
        with socket.create_connection((addr, port), timeout=timeout) as connection:
            answer = read_answer(connection, len(token.encode()), time.monotonic() + timeout)
    except ConnectionRefusedError:
        return False
    except OSError:
        return None
    if not answer:
        return None
    return hmac.compare_digest(answer, token.encode())


def read_answer(connection: socket.socket, size: int, deadline: float) -> bytes:
    """The first ``size`` bytes (at most MAX_ANSWER_BYTES) the other end writes, or fewer if it
    closes first; by ``deadline`` (monotonic) at the latest, however slowly it writes.

    Raises:
        OSError: the connection failed, or ``deadline`` passed first (socket.timeout).
    """
    size = min(size, MAX_ANSWER_BYTES)
    answer = b""
    while len(answer) < size:
        left = deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout(f"no complete answer within the deadline ({len(answer)} of {size} bytes)")
        connection.settimeout(left)
        chunk = connection.recv(size - len(answer))
        if not chunk:
            break
        answer += chunk
    return answer


class Liveness:
    """This node's beacon, published in the rendezvous ``store``, and the probes of other nodes'."""

    def __init__(self, store, node: _NodeDesc, settings: RendezvousSettings) -> None:
        self._store, self._node, self._settings = store, node, settings
        self._beacon: Beacon | None = None
        self._token = ""
        self._published = False
        self._next_probe: dict[str, float] = {}  # node name -> monotonic time
        # Nodes whose beacon this node saw close without a word (.watch, .notice): probed at the
        # next ``gone`` whatever their last heartbeat says, once each (see ``suspect``).
        self._suspects: set[str] = set()

    def start(self) -> None:
        """Start the beacon (once) and try to publish it: a socket error leaves liveness to
        keep-alive; a store that cannot be written yet (etcd-v3's, before the first round's state
        exists) is tried again by ``publish`` once the round formed."""
        if self._beacon is None:
            try:
                self._token = secrets.token_hex(TOKEN_BYTES)
                self._beacon = Beacon(self._token, listen_host())
            except Exception as error:  # noqa: BLE001 - an optimisation: keep-alive still works without it
                log.warning("liveness beacon not started (%s); dead nodes expire by keep-alive only", error)
                return
        self.publish(quiet=True)

    def publish(self, quiet: bool = False) -> None:
        """Publish the beacon in the store, unless done already; ``quiet``: a failure is not
        worth a warning (it is tried again)."""
        if self._beacon is None or self._published:
            return
        try:
            host = listen_host()
            published = {"addr": advertised_address(host, self._node.addr), "port": self._beacon.port,
                         "token": self._token, "netns": network_namespace()}
            self._store.set(KEY_PREFIX + repr(self._node), json.dumps(published))
            self._published = True
        except Exception as error:  # noqa: BLE001 - an optimisation: keep-alive still works without it
            (log.debug if quiet else log.warning)(
                "liveness beacon not published (%s); dead nodes expire by keep-alive only", error)

    def stop(self) -> None:
        if self._beacon is not None:
            self._beacon.close()

    def suspect(self, names: list[str]) -> None:
        """Probe the nodes named (``repr`` of their _NodeDesc) at the next ``gone`` without waiting
        for them to miss a heartbeat: this node saw their beacon close without LEAVING (.watch).

        A dead node's last heartbeat is up to ``keep_alive_interval`` old when it dies, so waiting
        for it to miss one kept the survivors' next round waiting that long after the notice
        (0-2 s, ~1 s on average, with the tests' 2 s interval: most of a ~1.4 s recovery). The
        probe still decides: only a refusal (or another token) makes a suspect gone; a suspect that
        answers, or cannot be asked, is no longer one and waits for a missed heartbeat as any node.
        """
        self._suspects.update(names)

    def gone(self, state: _RendezvousState) -> list[_NodeDesc]:
        """The nodes in ``state`` whose beacon says they are gone, of those that have missed a
        heartbeat or are suspects (``suspect``)."""
        now_wall, now = datetime.now(timezone.utc), time.monotonic()
        late = now_wall - self._settings.keep_alive_interval
        gone = []
        self._suspects &= {repr(node) for node in state.last_heartbeats}  # the others left the state already
        for node, heartbeat in list(state.last_heartbeats.items()):
            name = repr(node)
            if node == self._node:
                continue
            if name in self._suspects:
                self._suspects.discard(name)  # probed once as a suspect; after that, as any node
            elif heartbeat > late or self._next_probe.get(name, 0) > now:
                continue
            answer = self._probe(node)
            if answer is False:
                gone.append(node)
            else:  # alive, or unknown: keep-alive expiry decides meanwhile
                wait = ALIVE_RECHECK_SECONDS if answer else self._settings.keep_alive_interval.total_seconds()
                self._next_probe[name] = now + wait
        return gone

    def _probe(self, node: _NodeDesc) -> bool | None:
        address = self.beacon_of(node)
        return None if address is None else probe(*address)

    def beacon_of(self, node: _NodeDesc) -> tuple[str, int, str] | None:
        """(address, port, token) where ``node``'s beacon can be asked from here; None where
        nothing can be asked: none published (or not ours), or a loopback address of another
        network namespace."""
        key = KEY_PREFIX + repr(node)
        try:
            if not self._store.check([key]):
                return None
            published = parse_published(self._store.get(key))
        except Exception:  # noqa: BLE001 - no beacon to ask: unknown
            return None
        if published is None:  # an older agent's port alone, or not ours: unknown
            return None
        addr, port, token, netns = published
        if ipaddress.ip_address(addr).is_loopback and netns != network_namespace():
            return None  # another machine's (or pod's) loopback: this one's would answer for it
        return addr, port, token


def advertised_address(host: str, node_addr: str) -> str:
    """The address peers probe this node's beacon at: the one it listens on, or, listening on
    every interface, what this node's own name resolves to here (a pod's /etc/hosts names its IP),
    resolved once by the node itself so that no peer has to trust a name service."""
    if host not in EVERY_INTERFACE:
        return host
    return socket.getaddrinfo(node_addr, None, type=socket.SOCK_STREAM)[0][4][0]


def parse_published(raw: bytes) -> tuple[str, int, str, str] | None:
    """(address, port, token, network namespace) of a published beacon; None for anything else."""
    try:
        if len(raw) > MAX_PUBLISHED_BYTES:
            return None
        found = json.loads(raw)
        addr, port, token, netns = found["addr"], found["port"], found["token"], found.get("netns", "")
        ipaddress.ip_address(addr)  # an address, never a name to resolve
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    if type(port) is not int or not 0 < port < 65536 or not isinstance(token, str) or not 0 < len(token) <= 64:
        return None
    return addr, port, token, str(netns)


def network_namespace() -> str:
    """This machine's boot id and this process's network namespace: where a loopback address
    means the same listener ("" where /proc does not say)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}/{os.stat('/proc/self/ns/net').st_ino}"
    except OSError:
        return ""


def forget(state: _RendezvousState, nodes: list[_NodeDesc], settings: RendezvousSettings) -> None:
    """Remove ``nodes`` from ``state`` as torch's keep-alive expiry does (its state holder's
    _sanitize): heartbeat, participation, wait and redundancy lists, then its epilogue."""
    removed_participant = False
    for node in nodes:
        state.last_heartbeats.pop(node, None)
        removed_participant |= state.participants.pop(node, None) is not None
        state.wait_list.discard(node)
        state.redundancy_list.discard(node)
    if removed_participant:
        _remove_participant_epilogue(state, settings)
