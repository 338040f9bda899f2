"""A survivor's agent stops its workers the moment a peer's beacon closes, instead of waiting
for a worker to fail on the lost peer and exit (docs/recovery.md: that took ~1.2 s of ~1.5 s).

torch's agent asks its rendezvous handler, between two checks of its workers (every
``--monitor-interval``, 0.1 s), how many nodes wait to join (``num_nodes_waiting``); a positive
answer makes it restart its workers into a new round, a membership change that does not count
against ``--max-restarts``. :class:`~.early.EarlyRendezvousHandler` answers from here first:
once a round's workers run, :class:`LossNotice` watches the beacons of the round's peers
(:mod:`.watch`); when one closes without LEAVING, it logs and records the cause ("beacon
closed"), SIGKILLs this node's workers and answers 1, so the agent re-forms the group at once.

Why SIGKILL and not torch's SIGTERM-and-wait: the Trainer takes SIGTERM for a graceful stop,
which needs every peer in the step's all-reduce and so cannot complete without the lost one; the
worker would then fail on the lost connection and take its slow exit after all. Nothing of the
step in flight could be saved in any case: snapshots are written to a temporary name and renamed
(a SIGKILL leaves the previous complete one), and the fast tier resumes from the last complete
copy. A node that stops on purpose says LEAVING first (.liveness), so a clean finish, a graceful
stop or a scale-down of a peer never reaches this: its workers end the group as before.

Which peers: the ``MAX_WATCHED`` that follow this node in rank order, round the ring, so every
node is watched by as many and no node holds more connections than that, whatever the group's
size. Another survivor that does not watch the lost node learns of it from the round this one
opens (torch's ``num_nodes_waiting``) or from its own workers, as before.
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass

from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc

from ddpjob_trainer.rendezvous.liveness import Liveness
from ddpjob_trainer.rendezvous.watch import LOST, MAX_WATCHED, BeaconWatch, Peer

log = logging.getLogger(__name__)

# How far up the stack the agent that asked is looked for (it is the caller's caller at most).
AGENT_FRAMES = 8


@dataclass(frozen=True)
class Notice:
    """What made this node stop its workers: ``cause`` (watch.LOST) about ``nodes``, when (wall clock)."""

    cause: str
    nodes: tuple[str, ...]
    at: float
    stopped_pids: tuple[int, ...]


def peers_to_watch(participants: dict[_NodeDesc, int], me: _NodeDesc, limit: int = MAX_WATCHED) -> list[_NodeDesc]:
    """The ``limit`` participants that follow ``me`` in rank order, round the ring."""
    ordered = sorted(participants, key=lambda node: (participants[node], repr(node)))
    if me not in participants:
        return ordered[:limit]
    mine = ordered.index(me)
    count = min(limit, len(ordered) - 1)
    return [ordered[(mine + step) % len(ordered)] for step in range(1, count + 1)]


class LossNotice:
    """Watches the peers of this node's current round and stops its workers when one is lost."""

    def __init__(self, liveness: Liveness, node: _NodeDesc, watch: BeaconWatch | None = None) -> None:
        self._liveness, self._node = liveness, node
        self.watch = watch or BeaconWatch()
        self._to_watch: list[_NodeDesc] | None = None
        self.notices: list[Notice] = []  # what this agent acted on, oldest first

    def round_formed(self, participants: dict[_NodeDesc, int]) -> None:
        """A round completed with ``participants``: watch them once its workers run (``check``)."""
        self._to_watch = peers_to_watch(participants, self._node)

    def forget(self) -> None:
        """The round is over (this node re-rendezvouses): its peers' beacons are no longer watched.
        The peers seen lost are handed to liveness as suspects first, whether this notice acted on
        them or a worker failed on the lost peer before the agent asked: the next round removes them
        on a probe at once, instead of after they have missed a heartbeat (Liveness.suspect)."""
        self._liveness.suspect(self.watch.lost())
        self._to_watch = None
        self.watch.forget()

    def check(self) -> list[str]:
        """The peers lost since the round formed. The first call after ``round_formed`` reads
        where their beacons are (store reads, off the restart's critical path: the workers run)."""
        if self._to_watch is not None:
            nodes, self._to_watch = self._to_watch, None
            peers = [Peer(repr(node), *address) for node in nodes
                     if (address := self._liveness.beacon_of(node)) is not None]
            self.watch.watch(peers)
        return self.watch.lost()

    def act(self, lost: list[str]) -> Notice:
        """Stops this node's workers at once (SIGKILL) and records why; the caller restarts them."""
        pids = stop_workers_now(calling_agent())
        notice = Notice(LOST, tuple(lost), time.time(), tuple(pids))
        self.notices.append(notice)
        log.warning("Lost %s: its liveness beacon closed (%s: the agent's process is gone); stopped this node's "
                    "workers (pids %s) at once, re-forming the group", ", ".join(lost), LOST,
                    ", ".join(map(str, pids)) or "none found")
        self.forget()  # acted on: the agent re-rendezvouses next
        return notice

    def stop(self) -> None:
        self.watch.stop()


def calling_agent():
    """The torch agent whose monitor loop asked (``SimpleElasticAgent._invoke_run`` calls
    ``rdzv_handler.num_nodes_waiting``), or None. torch gives a rendezvous handler no handle on
    its agent; this is the one place that needs it, to reach the workers it started."""
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent

    frame = sys._getframe(1)
    for _ in range(AGENT_FRAMES):
        if frame is None:
            return None
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, SimpleElasticAgent):
            return candidate
        frame = frame.f_back
    return None


def stop_workers_now(agent) -> list[int]:
    """SIGKILLs the running workers ``agent`` started as subprocesses (each the leader of its own
    process group, as torch starts them: the group takes their children along); their pids.
    torch's own stop that follows finds them gone.

    Only a worker whose process torch has not reaped is signalled: its pid cannot have been
    reused. Workers of another start method (functions, not a script) are left to torch's stop.
    """
    handlers = getattr(getattr(agent, "_pcontext", None), "subprocess_handlers", None) or {}
    pids = sorted(handler.proc.pid for handler in handlers.values() if handler.proc.poll() is None)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    return pids
