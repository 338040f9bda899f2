"""A re-rendezvous that completes as soon as every node the rendezvous knows has joined.

torch's dynamic rendezvous completes a round when ``max_nodes`` have joined, or
``last_call_timeout`` after ``min_nodes`` had: an elastic job (max above the running size)
pays the whole last call on every restart, although after a failure the membership is
known. The round state lists every node that heartbeats (``last_heartbeats``: participants,
the wait list for the next round, the redundancy list) until a silent one is dropped after
``keep_alive_interval * keep_alive_max_attempt``. Once this node has been in a complete round,
a later round completes when every such node is a participant (or redundant, over
``max_nodes``): the survivors of a node loss go on as soon as the dead node has expired,
and a replacement already waiting is taken along in the same round.

A job's first round keeps torch's last call: nodes still starting are unknown to the state
yet, and completing without them would cost a restart when they arrive. A node that joins a
group already training knows the membership too (the group is in the state), so it completes
early from its first round, whichever of it and the group joins last. A node not yet
known (a replacement still being created) joins the next round, as with torch's last call
expired. Measured by ``python -m bench recovery`` (docs/recovery.md).

After a loss this node's agent noticed (:mod:`.notice`: a peer's beacon closed without a word),
its next round waits for the lost node's replacement up to ``replacement_wait`` seconds from the
notice (``--rdzv_conf replacement_wait``, spec.elasticPolicy.replacementWaitSeconds, default 0):
below the size of this node's previous round, neither the early completion nor torch's last call
completes it (this node keeps its heartbeat meanwhile). The replacement's join completes it at
once (everyone known joined; torch itself completes at ``max_nodes``): one pause for the
survivors instead of a round at reduced size and a second restart when the replacement arrives.
After the wait the round completes smaller, as without it. A peer that left on purpose said so
(its beacon's farewell) and is not waited for; nor is a loss this node learned only from its own
workers failing.

In every round, a node that has missed a heartbeat and whose liveness beacon says it is gone
(:mod:`.liveness`: its agent's process is dead on a host that is up) is removed at once
instead of after ``keep_alive_max_attempt`` missed heartbeats: the survivors of a killed node
no longer wait out its keep-alive.

While the group trains, the agent asks its handler every monitor interval whether nodes wait
(``num_nodes_waiting``); the handler first asks :mod:`.notice` whether a peer of the round was
lost (its beacon closed without a word), and if so stops this node's workers at once and answers
1: the agent re-forms the group without waiting for a worker to fail on the lost peer.

A node that joins a group already training (a replacement, a scale-up) first lets its fork
server (``elasticPolicy.fastRestart``, :mod:`ddpjob_trainer.zygote`) finish importing torch:
the group restarts its workers only once the newcomer can start its own at once, so the
group's pause does not include the newcomer's imports.

A warm spare (``DDPJOB_SPARE=1``, elasticPolicy.spareReplicas) starts with the nodes but joins
only once a group trains (or the rendezvous closed): the round then holds ``max_nodes``, so
torch's join op puts it in the redundancy list, where it keeps its heartbeat, is not counted
by ``num_nodes_waiting`` (the group does not restart for it) and waits without a join deadline.
When a participant is lost, it moves to the wait list in one write (torch would first drop it
from the state, heartbeat and all, then add it back: in between a survivor could complete its
round without it) and joins the survivors' next round (its join deadline renewed); the
survivors' round completes early with it (it is a known node). Its fork server is warm before it joins, as for any node joining a running group.
Started beside the nodes without waiting, a spare could take a place in the first round and
leave a node waiting as the spare.

torch's join loop re-reads the round state once a second while a node waits. Where the
membership is known (the rounds above), a waiting node re-reads it every ``poll_interval``
instead: a round another node opened or completed is seen within ~0.1 s, not up to 1 s, on
each side of a restart. The interval grows with the group, so the store serves at most
``MAX_STATE_READS_PER_SECOND`` state reads a second (what torch's own poll costs at that many
nodes), and in a larger group polls as torch does.
"""
from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
    DynamicRendezvousHandler, _Action, _remove_participant_epilogue, _RendezvousContext, _RendezvousExitOp,
    _RendezvousJoinOp, _should_keep_alive, create_handler,
)

from ddpjob_rdzv.contract import SPARE_ENV, replacement_wait_seconds

from ddpjob_trainer.rendezvous.liveness import Liveness, forget
from ddpjob_trainer.rendezvous.notice import LossNotice
from ddpjob_trainer.rendezvous.stagger import without_first_run_stagger

log = logging.getLogger(__name__)

# What torch's join op answers while this node waits in an incomplete round it takes part in.
_WAITING = (_Action.SYNC, _Action.KEEP_ALIVE)
FAST_POLL_SECONDS = 0.1
MAX_STATE_READS_PER_SECOND = 500
TORCH_POLL_SECONDS = 1.0  # the join loop's own delay (torch's executor, _Action.SYNC)


def poll_interval(nodes: int) -> float:
    """Seconds between two reads of the round state by one waiting node of a group of ``nodes``."""
    return min(TORCH_POLL_SECONDS, max(FAST_POLL_SECONDS, nodes / MAX_STATE_READS_PER_SECOND))


def everyone_known_joined(ctx: _RendezvousContext) -> bool:
    """Whether the round can complete now: this node takes part, the round is incomplete, the
    participants are within [min_nodes, max_nodes] and every node with a heartbeat in the
    state is a participant, or redundant beside a round already at max_nodes.

    A redundant node (a warm spare, elasticPolicy.spareReplicas) is placed only while the round
    is full: below max_nodes torch's join op takes it off the redundancy list and into the round
    at its next poll, so it is a known node that has not joined yet. Counted as placed there, a
    survivor of a node loss would complete the round without the spare (at reduced size), and
    the spare's join a moment later would restart the group a second time."""
    state, settings = ctx.state, ctx.settings
    if state.complete or state.closed or ctx.node not in state.participants:
        return False
    if not settings.min_nodes <= len(state.participants) <= settings.max_nodes:
        return False
    placed = set(state.participants)
    if len(state.participants) >= settings.max_nodes:
        placed |= set(state.redundancy_list)
    return all(node in placed for node in state.last_heartbeats)


def node_on_its_way(ctx: _RendezvousContext) -> bool:
    """Whether a node the state knows is about to join this incomplete round, which this node
    takes part in below max_nodes: a warm spare in the redundancy list, or a node in the wait
    list (a spare on its way out of the redundancy list, a replacement, a scale-up). torch's join
    op moves either into the round at that node's next read of the state (up to a second later,
    more on a busy machine). Completed at torch's last call without it, the round would run at
    reduced size and restart the group again a moment later when that node joins. Bounded: the
    node joins, or its heartbeat stops and keep-alive expiry (or its closed beacon) removes it
    from the state."""
    state, settings = ctx.state, ctx.settings
    on_its_way = (state.redundancy_list | state.wait_list) & state.last_heartbeats.keys()
    return (not state.complete and not state.closed and ctx.node in state.participants
            and len(state.participants) < settings.max_nodes and bool(on_its_way))


@dataclass(frozen=True)
class ReplacementWait:
    """After a lost peer: the round may complete with fewer than ``size`` participants (this
    node's previous round) only once ``until`` (time.monotonic()) has passed."""

    size: int
    until: float
    seconds: int  # the configured wait, for the log

    def holds(self, ctx: _RendezvousContext, now: float | None = None) -> bool:
        """Whether the round is still to wait: below ``size`` and before ``until``."""
        return len(ctx.state.participants) < self.size and (time.monotonic() if now is None else now) < self.until


class EarlyJoinOp(_RendezvousJoinOp):
    """torch's join op that first removes the nodes ``liveness`` proves gone and, when
    ``complete_early``, marks the round complete when everyone_known_joined. With ``refresh``
    (a fresh context from a fresh read of the state), it waits by polling every poll_interval
    instead of handing torch's loop a one-second wait. With ``wait`` (after a lost peer), a
    round below the previous size completes neither early nor at torch's last call while the
    wait holds. A spare leaving the redundancy list goes straight to the wait list, known to
    the others all the way into the round (node_on_its_way)."""

    def __init__(self, liveness: Liveness | None = None, mark_dirty=None, complete_early: bool = True,
                 refresh: Callable[[], _RendezvousContext] | None = None,
                 wait: ReplacementWait | None = None) -> None:
        self._liveness, self._mark_dirty, self._complete_early = liveness, mark_dirty, complete_early
        self._refresh, self._wait = refresh, wait
        self._said_redundant = False
        self._said_waiting = False
        self._renewed_deadline: float | None = None  # when a spare left the redundancy list (_decide)

    def __call__(self, ctx: _RendezvousContext, deadline: float) -> _Action:
        action = self._decide(ctx, deadline)
        # Ends: another node changed the round, a keep-alive is due, or the join timed out (torch's op
        # answers KEEP_ALIVE or ERROR_TIMEOUT then, never SYNC).
        while action == _Action.SYNC and self._refresh is not None:
            time.sleep(poll_interval(len(ctx.state.last_heartbeats)))
            ctx = self._refresh()
            action = self._decide(ctx, deadline)
        return action

    def _decide(self, ctx: _RendezvousContext, deadline: float) -> _Action:
        if not self._said_redundant and ctx.node in ctx.state.redundancy_list:
            self._said_redundant = True
            say_redundant(ctx)
        if self._liveness is not None and not ctx.state.closed and (gone := self._liveness.gone(ctx.state)):
            log.info("Removing %s from the rendezvous: its liveness beacon says it is gone",
                     ", ".join(map(repr, gone)))
            forget(ctx.state, gone, ctx.settings)
            self._mark_dirty()
            # A keep-alive is an action that writes: the removal is synced at once (compare-and-set;
            # if another node wrote first, the next call decides again on the fresh state).
            return _Action.KEEP_ALIVE
        if self._renewed_deadline is not None:
            deadline = max(deadline, self._renewed_deadline)
        action = super().__call__(ctx, deadline)
        if action == _Action.REMOVE_FROM_REDUNDANCY_LIST:
            # torch's removal deletes this node's heartbeat too: until its next write (the wait list
            # or the round) no other node knows it, and a survivor completes its round without it
            # (everyone it knows joined), to restart again when this node joins. The wait list
            # keeps it known in one write; the join deadline is renewed as torch renews it there.
            self._renewed_deadline = time.monotonic() + ctx.settings.timeout.join.total_seconds()
            return _Action.ADD_TO_WAIT_LIST
        if self._holds_for_replacement(ctx, action) or (
                action == _Action.MARK_RENDEZVOUS_COMPLETE and node_on_its_way(ctx)):
            # torch's last call would complete the round smaller: wait on, heartbeat included
            # (a node that only syncs would expire from the state meanwhile). Past the join
            # deadline torch's op answers otherwise (it takes this node out of the round).
            return _Action.KEEP_ALIVE if _should_keep_alive(ctx) else _Action.SYNC
        if self._complete_early and action in _WAITING and everyone_known_joined(ctx):
            return _Action.MARK_RENDEZVOUS_COMPLETE
        return action

    def _holds_for_replacement(self, ctx: _RendezvousContext, action: _Action) -> bool:
        """Whether this node, a participant of an incomplete round, waits for a lost peer's
        replacement (see ReplacementWait) instead of completing (or waiting as torch would)."""
        if self._wait is None:
            return False
        holds = self._wait.holds(ctx)
        if self._said_waiting and not holds:
            self._said_waiting = False
            say_wait_over(ctx, self._wait)
        if not holds or action not in (*_WAITING, _Action.MARK_RENDEZVOUS_COMPLETE):
            return False
        if ctx.node not in ctx.state.participants or ctx.state.complete:
            return False
        if not self._said_waiting:
            self._said_waiting = True
            say_waiting(ctx, self._wait)
        return True


def say_redundant(ctx: _RendezvousContext) -> None:
    """Says, once per wait, that this node waits in the redundancy list. On stderr, not through
    logging (torchrun's agents show warnings only): a warm spare's log (a pod's, `ddpjob run`'s
    logs/node-<i>.log) shows the moment it stands ready."""
    print(f"ddpjob_trainer: waiting outside the group as a spare (round {ctx.state.round} holds max_nodes "
          f"{ctx.settings.max_nodes}): joins the next round when a node is lost", file=sys.stderr, flush=True)


def say_waiting(ctx: _RendezvousContext, wait: ReplacementWait) -> None:
    """Says (on stderr, as say_redundant) that the round waits for a lost node's replacement."""
    print(f"ddpjob_trainer: a node was lost: round {ctx.state.round} waits up to {wait.seconds} s for its "
          f"replacement ({len(ctx.state.participants)} of the {wait.size} nodes before the loss have joined)",
          file=sys.stderr, flush=True)


def say_wait_over(ctx: _RendezvousContext, wait: ReplacementWait) -> None:
    """Says how the wait for a replacement ended: it joined, or the round goes on smaller."""
    joined = len(ctx.state.participants)
    how = (f"the replacement joined: {joined} nodes, one pause" if joined >= wait.size else
           f"no replacement within {wait.seconds} s: re-forming at reduced size ({joined} of {wait.size} nodes)")
    print(f"ddpjob_trainer: round {ctx.state.round}: {how}", file=sys.stderr, flush=True)


class RejoiningExitOp:
    """torch's exit op (a node leaves its round before joining the next), except that the
    node's heartbeat stays in the state.

    torch's removes it, so between a node's exit and its join (two writes) the others do not
    know it: a waiting node that completes rounds early would then form the next round
    without it, and it would cost the group one more restart to take it in. Kept, it is a
    known node that has not joined yet, and the round waits for it; should it die on the way,
    its heartbeat expires (or its beacon says so) as any other's."""

    def __init__(self, mark_dirty) -> None:
        self._mark_dirty = mark_dirty

    def __call__(self, ctx: _RendezvousContext, deadline: float) -> _Action:
        state = ctx.state
        if ctx.node not in state.participants:
            return _Action.FINISH
        if time.monotonic() > deadline:
            return _Action.ERROR_TIMEOUT
        del state.participants[ctx.node]
        _remove_participant_epilogue(state, ctx.settings)
        self._mark_dirty()
        return _Action.KEEP_ALIVE  # an action that writes (compare-and-set; on a conflict this runs again)


class _EarlyExecutor:
    """The handler's executor, running torch's exit op as RejoiningExitOp and its join op as
    EarlyJoinOp (torch builds both inside next_rendezvous): with the liveness probe always,
    completing early once the membership is known."""

    def __init__(self, inner, handler: "EarlyRendezvousHandler"):
        self._inner, self._handler = inner, handler

    def run(self, state_handler, deadline, update_deadline=None) -> None:
        if type(state_handler) is _RendezvousExitOp:
            state_handler = RejoiningExitOp(self._handler._state_holder.mark_dirty)
        if type(state_handler) is _RendezvousJoinOp:
            handler = self._handler
            state_handler = EarlyJoinOp(handler.liveness, handler._state_holder.mark_dirty,
                                        complete_early=handler.membership_known,
                                        refresh=self._refresh if handler.membership_known else None,
                                        wait=handler.pending_wait)
        self._inner.run(state_handler, deadline, update_deadline)

    def _refresh(self) -> _RendezvousContext:
        """Reads the round state now and hands it to torch's executor, which applies the next
        action to the state it holds (so an action decided on the fresh state is applied to it)."""
        holder = self._handler._state_holder
        holder._last_sync_time = -1.0  # torch's holder serves its cached state for a second
        holder.sync()
        self._inner._state = holder.state
        return _RendezvousContext(self._inner._node, holder.state, self._inner._settings)


class EarlyRendezvousHandler(DynamicRendezvousHandler):
    """torch's handler whose re-rendezvous completes early (see the module docstring)."""

    def __init__(self, *args, warm=None, spare: bool | None = None, replacement_wait: int = 0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # Seconds a round after a noticed loss waits for the lost node's replacement (module docstring).
        self.replacement_wait = replacement_wait
        self._last_size: int | None = None  # participants of this node's last complete round
        self._lost_at: float | None = None  # time.monotonic() of the loss noticed since that round
        self.pending_wait: ReplacementWait | None = None  # what the join of the current round waits for
        self._warm = warm  # the node's prestarted fork server (zygote.Warm), if any
        # A warm spare: its first join waits for a group that trains (see the module docstring).
        self.spare = os.environ.get(SPARE_ENV) == "1" if spare is None else spare
        # Whether every node that belongs in the next round is in the state: after a round of
        # our own, or when joining a group that trains (only a job's first round has nodes
        # still starting that the state does not know yet).
        self.membership_known = False
        self._op_executor = _EarlyExecutor(self._op_executor, self)
        self.liveness = Liveness(self._store, self._this_node, self._settings)
        self.notice = LossNotice(self.liveness, self._this_node)

    @classmethod
    def like(cls, handler: DynamicRendezvousHandler, backend_name: str | None = None,
             warm=None, spare: bool | None = None, replacement_wait: int = 0) -> "EarlyRendezvousHandler":
        """A handler on the same node, settings, backend, store and state as torch's ``handler``
        (built by torch's create_handler, which parses the --rdzv_conf keys), named
        ``backend_name`` (torch's registry checks it is the --rdzv_backend asked for); ``spare``:
        a warm spare (None: as DDPJOB_SPARE says); ``replacement_wait``: see the module docstring."""
        return cls(handler._this_node, handler._settings, backend_name or handler._backend_name, handler._store,
                   handler._state_holder, warm=warm, spare=spare, replacement_wait=replacement_wait)

    def next_rendezvous(self):
        self.liveness.start()
        self.notice.forget()  # the round this node leaves: its peers' beacons no longer matter
        if self.spare and not self.membership_known:
            self._wait_for_group()
        if not self.membership_known and self._group_running():
            self.membership_known = True
            if self._warm is not None:
                started = time.monotonic()
                self._warm.wait()
                log.info("Joining a running group after this node's fork server imported torch (%.1f s)",
                         time.monotonic() - started)
        self.pending_wait = self._replacement_wait()
        try:
            with without_first_run_stagger(self.membership_known):  # a restart is not a first run (.stagger)
                info = super().next_rendezvous()
        finally:
            self.pending_wait, self._lost_at = None, None
        self._last_size = len(self._state_holder.state.participants)
        self.membership_known = True
        self.liveness.publish()  # where the store could not be written before the first round (etcd-v3)
        self.notice.round_formed(dict(self._state_holder.state.participants))
        return info

    def num_nodes_waiting(self) -> int:
        """torch's answer, or 1 once a peer of the round is lost (.notice), after stopping this
        node's workers: either way the agent restarts them into a new round."""
        lost = self.notice.check()
        if lost:
            self._lost_at = time.monotonic()
            self.notice.act(lost)
            return 1
        return super().num_nodes_waiting()

    def _replacement_wait(self) -> ReplacementWait | None:
        """What the next round waits for: after a loss noticed since this node's last round,
        that round's size, until replacement_wait seconds after the notice; else nothing."""
        if not self.replacement_wait or self._lost_at is None or not self._last_size:
            return None
        return ReplacementWait(self._last_size, self._lost_at + self.replacement_wait, self.replacement_wait)

    def _wait_for_group(self) -> None:
        """A spare's first join: waits until a group trains (the round is complete) or the
        rendezvous closed (then torch's join ends this agent), at most the join timeout (then
        it joins as any node would)."""
        deadline = time.monotonic() + self._settings.timeout.join.total_seconds()
        while not self._group_running() and not self._state_holder.state.closed:
            if time.monotonic() >= deadline:
                log.warning("Spare: no group trained within the join timeout; joining the rendezvous as a node")
                return
            time.sleep(poll_interval(len(self._state_holder.state.last_heartbeats)))

    def _group_running(self) -> bool:
        """Whether other nodes train in a complete round now (so joining will restart them)."""
        self._state_holder.sync()
        state = self._state_holder.state
        return state.complete and bool(state.participants)

    def shutdown(self) -> bool:
        self.notice.stop()
        self.liveness.stop()
        return super().shutdown()


def create_early_handler(store, backend, params, warm=None) -> EarlyRendezvousHandler:
    """torch's ``create_handler(store, backend, params)``, completing re-rendezvous early and,
    after a lost peer, waiting ``--rdzv_conf replacement_wait`` seconds for its replacement;
    ``warm``: the node's prestarted fork server.

    Raises:
        ValueError: replacement_wait is not an integer from 0 to 300 (naming key and value).
    """
    return EarlyRendezvousHandler.like(create_handler(store, backend, params), params.backend, warm,
                                       replacement_wait=replacement_wait_seconds(params.config))
