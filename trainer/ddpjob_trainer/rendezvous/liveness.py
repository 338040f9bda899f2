"""Telling a dead node from a late one, without waiting out its keep-alive.

torch's dynamic rendezvous drops a node only when it has missed ``keep_alive_max_attempt``
heartbeats (6 s with the tests' 2 s x 3, 15 s with torch's defaults). After a node loss the
survivors spend most of their pause waiting for exactly that (docs/recovery.md). But the usual
death is a process death on a host that is still up (a SIGKILLed or OOM-killed agent, a
container killed with its pod): then the kernel can say so at once, by refusing connections.

So every agent under ddpjob's rendezvous keeps a *beacon*: a listening socket, closed by the
kernel when the agent dies, that answers each connection with the node's name. Its port is
published in the rendezvous store. A node that has missed a heartbeat is *probed*:

* connection refused, or another name answered (the port was freed and taken again): the
  node is **gone**, and is removed from the round as keep-alive expiry would have removed it;
* its own name answered: alive, merely late;
* anything else (a timeout, an unreachable host: a lost machine, a pod whose network went
  with it, no beacon published): **unknown**, and keep-alive expiry decides as before.

Only "gone" shortens anything, and it needs a positive answer from the node's host, so a
live node is never dropped. Probes cost nothing while every node beats on time: only late
nodes are probed, one that answered at most once a second, one that did not at most once per
keep-alive interval.
"""
from __future__ import annotations

import logging
import socket
import threading
import time
from datetime import datetime, timezone

from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
    RendezvousSettings, _NodeDesc, _remove_participant_epilogue, _RendezvousState,
)

log = logging.getLogger(__name__)

KEY_PREFIX = "ddpjob/liveness/"
# One probe's bound for connecting and for reading the answer; a node whose host does not
# answer within it is "unknown", never "gone".
PROBE_TIMEOUT_SECONDS = 0.5
# A name is at most a host name (253) plus a pid and a counter.
MAX_NAME_BYTES = 512
# A late node that answered is probed again at most this often (a waiting node decides several
# times a second, rendezvous/early.py).
ALIVE_RECHECK_SECONDS = 1.0


class Beacon:
    """A listening socket that answers each connection with ``name`` and closes it; the kernel
    refuses connections once the process that holds it is gone."""

    def __init__(self, name: str) -> None:
        self._answer = name.encode()
        if socket.has_dualstack_ipv6():
            self._socket = socket.create_server(("", 0), family=socket.AF_INET6, dualstack_ipv6=True)
        else:
            self._socket = socket.create_server(("", 0))
        self.port = self._socket.getsockname()[1]
        threading.Thread(target=self._serve, name="ddpjob-liveness-beacon", daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self._socket.accept()
            except OSError:  # closed
                return
            with connection:
                try:
                    connection.settimeout(PROBE_TIMEOUT_SECONDS)
                    connection.sendall(self._answer)
                except OSError:
                    pass

    def close(self) -> None:
        # close() alone does not stop a listening socket another thread is accepting on:
        # shutdown() does, and wakes that thread up.
        try:
            self._socket.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._socket.close()


def probe(addr: str, port: int, name: str, timeout: float = PROBE_TIMEOUT_SECONDS) -> bool | None:
    """True: ``name``'s beacon answered at ``addr:port``; False: it is provably gone there;
    None: unknown."""
    try:
        with socket.create_connection((addr, port), timeout=timeout) as connection:
            connection.settimeout(timeout)
            answer = _read_all(connection)
    except ConnectionRefusedError:
        return False
    except OSError:
        return None
    if not answer:
        return None
    return answer == name.encode()


def _read_all(connection: socket.socket) -> bytes:
    answer = b""
    while len(answer) <= MAX_NAME_BYTES:
        chunk = connection.recv(MAX_NAME_BYTES + 1 - len(answer))
        if not chunk:
            break
        answer += chunk
    return answer


class Liveness:
    """This node's beacon, published in the rendezvous ``store``, and the probes of other nodes'."""

    def __init__(self, store, node: _NodeDesc, settings: RendezvousSettings) -> None:
        self._store, self._node, self._settings = store, node, settings
        self._beacon: Beacon | None = None
        self._next_probe: dict[str, float] = {}  # node name -> monotonic time

    def start(self) -> None:
        """Start and publish the beacon (once; a store or socket error leaves liveness to keep-alive)."""
        if self._beacon is not None:
            return
        try:
            self._beacon = Beacon(repr(self._node))
            self._store.set(KEY_PREFIX + repr(self._node), str(self._beacon.port))
        except Exception as error:  # noqa: BLE001 - an optimisation: keep-alive still works without it
            log.warning("liveness beacon not published (%s); dead nodes expire by keep-alive only", error)

    def stop(self) -> None:
        if self._beacon is not None:
            self._beacon.close()

    def gone(self, state: _RendezvousState) -> list[_NodeDesc]:
        """The nodes in ``state`` that have missed a heartbeat and whose beacon says they are gone."""
        now_wall, now = datetime.now(timezone.utc), time.monotonic()
        late = now_wall - self._settings.keep_alive_interval
        gone = []
        for node, heartbeat in list(state.last_heartbeats.items()):
            name = repr(node)
            if node == self._node or heartbeat > late or self._next_probe.get(name, 0) > now:
                continue
            answer = self._probe(node)
            if answer is False:
                gone.append(node)
            else:  # alive, or unknown: keep-alive expiry decides meanwhile
                wait = ALIVE_RECHECK_SECONDS if answer else self._settings.keep_alive_interval.total_seconds()
                self._next_probe[name] = now + wait
        return gone

    def _probe(self, node: _NodeDesc) -> bool | None:
        key = KEY_PREFIX + repr(node)
        try:
            if not self._store.check([key]):
                return None
            port = int(self._store.get(key))
        except Exception:  # noqa: BLE001 - no beacon to ask: unknown
            return None
        return probe(node.addr, port, repr(node))


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
