"""A re-rendezvous completes as soon as every node the rendezvous knows has joined
(ddpjob_trainer.rendezvous.early), instead of waiting out torch's last call."""
import time
from datetime import datetime, timedelta, timezone

import pytest
from torch.distributed import HashStore
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
    DynamicRendezvousHandler, RendezvousSettings, RendezvousTimeout, _Action, _NodeDesc, _RendezvousContext,
    _RendezvousJoinOp, _RendezvousState,
)

from ddpjob_trainer.rendezvous.liveness import forget
from ddpjob_trainer.rendezvous.early import (
    MAX_STATE_READS_PER_SECOND, EarlyJoinOp, EarlyRendezvousHandler, RejoiningExitOp, ReplacementWait,
    everyone_known_joined, poll_interval,
)

SURVIVOR, DEAD, NEWCOMER = (_NodeDesc("node", pid, 0) for pid in (1, 2, 3))
LAST_CALL = timedelta(seconds=30)


def settings(min_nodes=1, max_nodes=4) -> RendezvousSettings:
    return RendezvousSettings("run", min_nodes, max_nodes, RendezvousTimeout(last_call=LAST_CALL),
                              keep_alive_interval=timedelta(seconds=2), keep_alive_max_attempt=3)


def round_with(participants, heartbeats, *, wait_list=(), redundant=(), complete=False) -> _RendezvousState:
    """A round as the survivor sees it after joining; the last call runs for another 30 s."""
    state = _RendezvousState()
    state.round, state.complete = 2, complete
    state.participants = {node: 0 for node in participants}
    state.wait_list, state.redundancy_list = set(wait_list), set(redundant)
    now = datetime.now(timezone.utc)
    state.last_heartbeats = {node: now for node in heartbeats}
    state.deadline = now + LAST_CALL
    return state


def join(state, node=SURVIVOR, **kw):
    """(torch's answer, the early join's answer) for `node` in `state`."""
    ctx = _RendezvousContext(node, state, settings(**kw))
    deadline = time.monotonic() + 60
    return _RendezvousJoinOp()(ctx, deadline), EarlyJoinOp()(ctx, deadline)


def test_the_survivor_alone_completes_at_once_once_the_dead_node_expired():
    torch_says, early_says = join(round_with([SURVIVOR], [SURVIVOR]))
    assert torch_says in (_Action.SYNC, _Action.KEEP_ALIVE), "torch waits out its last call"
    assert early_says == _Action.MARK_RENDEZVOUS_COMPLETE


# Rounds are built when the test runs, not at collection: their heartbeats are "now", and a
# suite that reaches this test minutes after collecting it would see them expired.
@pytest.mark.parametrize("make_state, why", [
    (lambda: round_with([SURVIVOR], [SURVIVOR, DEAD]), "a node whose keep-alive has not expired yet"),
    (lambda: round_with([SURVIVOR], [SURVIVOR, NEWCOMER], wait_list=[NEWCOMER]), "a node on the wait list"),
])
def test_a_known_node_that_has_not_joined_yet_is_waited_for(make_state, why):
    state = make_state()
    assert join(state)[1] in (_Action.SYNC, _Action.KEEP_ALIVE), why
    assert not everyone_known_joined(_RendezvousContext(SURVIVOR, state, settings()))


def test_a_replacement_already_known_is_taken_along_in_the_same_round():
    state = round_with([SURVIVOR, NEWCOMER], [SURVIVOR, NEWCOMER])
    assert join(state)[1] == _Action.MARK_RENDEZVOUS_COMPLETE
    assert join(state, node=NEWCOMER)[1] == _Action.MARK_RENDEZVOUS_COMPLETE


def test_redundant_nodes_beyond_max_nodes_do_not_hold_the_round():
    state = round_with([SURVIVOR, NEWCOMER], [SURVIVOR, NEWCOMER, DEAD], redundant=[DEAD])
    assert join(state, max_nodes=2)[1] in (_Action.MARK_RENDEZVOUS_COMPLETE, _Action.FINISH)


def test_a_spare_waiting_beside_a_round_below_max_nodes_is_waited_for():
    """A warm spare sits in the redundancy list while the group is full; after a node loss the
    survivor's new round is below max_nodes, torch's join op moves the spare into it at its next
    poll, and the round waits for it instead of completing at reduced size (one pause, not two)."""
    state = round_with([SURVIVOR], [SURVIVOR, NEWCOMER], redundant=[NEWCOMER])
    torch_says, early_says = join(state, max_nodes=2)
    assert early_says == torch_says and early_says in (_Action.SYNC, _Action.KEEP_ALIVE)
    assert not everyone_known_joined(_RendezvousContext(SURVIVOR, state, settings(max_nodes=2)))
    # ... and torch's own join op of the spare takes it off the list into the round
    spare = _RendezvousContext(NEWCOMER, state, settings(max_nodes=2))
    assert _RendezvousJoinOp()(spare, time.monotonic() + 60) == _Action.REMOVE_FROM_REDUNDANCY_LIST


@pytest.mark.parametrize("make_state, kw, why", [
    (lambda: round_with([SURVIVOR], [SURVIVOR]), {"min_nodes": 2}, "fewer participants than min_nodes"),
    (lambda: round_with([DEAD], [SURVIVOR, DEAD]), {}, "this node is not a participant"),
    (lambda: round_with([SURVIVOR], [SURVIVOR], complete=True), {}, "the round is complete already"),
])
def test_the_early_join_only_completes_a_round_torch_would_complete_later(make_state, kw, why):
    torch_says, early_says = join(make_state(), **kw)
    assert early_says == torch_says, why


def test_a_node_between_its_exit_and_its_join_is_still_waited_for():
    """The last participant leaves its round to join the next: the round moves on and the node
    stays known, so a node already in the next round does not complete it alone meanwhile."""
    state = round_with([SURVIVOR], [SURVIVOR, NEWCOMER], wait_list=[NEWCOMER], complete=True)
    dirty = []
    ctx = _RendezvousContext(SURVIVOR, state, settings())
    assert RejoiningExitOp(lambda: dirty.append(True))(ctx, time.monotonic() + 60) == _Action.KEEP_ALIVE
    assert dirty and not state.participants and SURVIVOR in state.last_heartbeats
    assert (state.round, state.complete) == (3, False), "torch's epilogue: the empty round moved on"
    state.participants[NEWCOMER] = 0  # the newcomer joins the new round first
    state.wait_list.discard(NEWCOMER)
    assert join(state, node=NEWCOMER)[1] in (_Action.SYNC, _Action.KEEP_ALIVE), "it waits for the survivor"
    assert RejoiningExitOp(lambda: None)(ctx, time.monotonic() + 60) == _Action.FINISH, "out of the round: done"


def test_a_waiting_join_polls_the_state_itself_and_answers_once_another_node_changed_it():
    """Instead of handing torch's loop a one-second wait: the replacement's joining is seen on
    the next poll, and the round completes."""
    waiting = round_with([SURVIVOR], [SURVIVOR, NEWCOMER], wait_list=[NEWCOMER])
    joined = round_with([SURVIVOR, NEWCOMER], [SURVIVOR, NEWCOMER])
    reads = []

    def refresh():
        reads.append(True)
        return _RendezvousContext(SURVIVOR, waiting if len(reads) < 3 else joined, settings())

    op = EarlyJoinOp(refresh=refresh)
    action = op(_RendezvousContext(SURVIVOR, waiting, settings()), time.monotonic() + 60)
    assert action == _Action.MARK_RENDEZVOUS_COMPLETE and len(reads) == 3


def test_the_poll_keeps_the_store_within_its_read_budget_or_torchs_own_rate_and_is_never_slower():
    assert poll_interval(2) == 0.1
    for nodes in (2, 50, 100, 500, 5000):
        torch_rate = nodes / 1.0  # torch's join loop: one read per node per second
        assert nodes / poll_interval(nodes) <= max(MAX_STATE_READS_PER_SECOND, torch_rate)
        assert poll_interval(nodes) <= 1.0


def test_a_handler_keeps_the_last_call_for_its_first_round_and_skips_it_afterwards():
    """Through torch's own executor and the c10d backend on an in-process store: the first
    round waits the last call (nodes still starting are unknown), the next one does not.

    torch's executor sleeps a fixed second at every SYNC step, so the second round costs about
    1 s of sleeping plus its work whatever the handler does: with a 3 s last call only 0.5 s was
    left for the work, which a busy machine overran (1.65 s), and with 6 s a machine at load 35
    took 4.1-4.8 s of work (store round trips of a starved process). The wait the handler must
    skip is the test's to choose: at 12 s it stands far above any of that (the rule, "under half
    the last call", is the same)."""
    last_call = 12.0
    backend = C10dRendezvousBackend(HashStore(), "run")
    plain = DynamicRendezvousHandler.from_backend("run", HashStore(), backend, 1, 4, "localhost",
                                                  RendezvousTimeout(last_call=timedelta(seconds=last_call)))
    handler = EarlyRendezvousHandler.like(plain)
    seconds = []
    for _ in range(2):
        started = time.monotonic()
        info = handler.next_rendezvous()
        seconds.append(time.monotonic() - started)
        assert (info.rank, info.world_size) == (0, 1)
    handler.shutdown()
    assert seconds[0] >= last_call, seconds
    assert seconds[1] < last_call / 2, seconds


def test_torchrun_finds_the_ddpjob_c10d_backend_through_its_registry():
    """torchrun resolves --rdzv_backend through this registry (the torchrun.handlers entry point)."""
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

    from ddpjob_sandbox.procs import free_port

    params = RendezvousParameters("ddpjob-c10d", f"127.0.0.1:{free_port()}", "run", 1, 4, is_host=True)
    handler = get_rendezvous_handler(params)
    try:
        assert isinstance(handler, EarlyRendezvousHandler) and handler.get_backend() == "ddpjob-c10d"
    finally:
        handler.shutdown()


def drop(handler) -> None:
    """`handler`'s node is lost: its heartbeats stop and it leaves the state as torch's keep-alive
    expiry (or, sooner, its closed beacon: liveness.forget) removes it."""
    handler._stop_heartbeats()
    holder = handler._state_holder
    holder._last_sync_time = -1.0
    holder.sync()
    forget(holder.state, [handler._this_node], handler._settings)
    holder.mark_dirty()
    holder.sync()


def test_a_spare_waits_outside_the_first_round_then_in_the_redundancy_list_and_joins_when_a_node_leaves():
    """Three handlers on one in-process store, max_nodes 2: the spare (started first) does not take
    a place in the first round, then waits in torch's redundancy list without making the group
    restart (num_nodes_waiting stays 0), and joins the round that follows a node's leaving."""
    import threading

    store = HashStore()
    backend = C10dRendezvousBackend(store, "run")

    def handler(name, spare=False):
        plain = DynamicRendezvousHandler.from_backend("run", store, backend, 1, 2, name,
                                                      RendezvousTimeout(last_call=timedelta(seconds=1)))
        return EarlyRendezvousHandler.like(plain, spare=spare)

    spare, first, second = (handler("localhost", spare=True), handler("localhost"), handler("localhost"))
    joined = {}

    def rendezvous(name, h):
        joined[name] = h.next_rendezvous()

    waiting = threading.Thread(target=rendezvous, args=("spare", spare), daemon=True)
    waiting.start()
    time.sleep(0.5)
    assert not spare._state_holder.state.participants, "the spare joined a round before any group trained"
    group = [threading.Thread(target=rendezvous, args=(name, h)) for name, h in (("a", first), ("b", second))]
    for thread in group:
        thread.start()
    for thread in group:
        thread.join(timeout=30)
    assert {joined["a"].world_size, joined["b"].world_size} == {2}
    deadline = time.monotonic() + 10
    while spare._this_node not in first._state_holder.state.redundancy_list and time.monotonic() < deadline:
        time.sleep(0.1)
        first._state_holder._last_sync_time = -1.0
        first._state_holder.sync()
    assert spare._this_node in first._state_holder.state.redundancy_list
    assert first.num_nodes_waiting() == 0 and "spare" not in joined  # the group trains on

    # Node b is lost (shutdown() would close the rendezvous).
    drop(second)
    rejoin = threading.Thread(target=rendezvous, args=("a", first))
    rejoin.start()
    rejoin.join(timeout=30)
    waiting.join(timeout=30)
    assert joined["a"].world_size == 2 and joined["spare"].world_size == 2
    assert {joined["a"].rank, joined["spare"].rank} == {0, 1}  # one round, the two of them
    for h in (first, spare):
        h.shutdown()


# --- The survivors' wait for a lost node's replacement (elasticPolicy.replacementWaitSeconds) ---

def last_call_over(state: _RendezvousState) -> _RendezvousState:
    """`state` with torch's last call expired: torch's own join op would complete the round now."""
    state.deadline = datetime.now(timezone.utc) - timedelta(seconds=1)
    return state


def waiting_for(size: int, seconds_left: float) -> ReplacementWait:
    return ReplacementWait(size, time.monotonic() + seconds_left, 30)


def test_torchs_last_call_does_not_complete_a_round_below_max_nodes_while_a_spare_is_on_its_way():
    """A survivor alone after a loss, a warm spare still in the redundancy list (it moves into the
    round at its own next read, up to a second later): torch would complete the round at world
    size 1 once its last call is over, and the spare's join would restart the group again. The
    round waits for it, until the join deadline; with no spare it completes."""
    spared = last_call_over(round_with([SURVIVOR], [SURVIVOR, NEWCOMER], redundant=[NEWCOMER]))
    ctx = _RendezvousContext(SURVIVOR, spared, settings(max_nodes=2))
    assert _RendezvousJoinOp()(ctx, time.monotonic() + 60) == _Action.MARK_RENDEZVOUS_COMPLETE
    assert EarlyJoinOp()(ctx, time.monotonic() + 60) == _Action.SYNC
    past = time.monotonic() - 0.1  # the join deadline: torch's own answer stands
    assert EarlyJoinOp()(ctx, past) == _RendezvousJoinOp()(ctx, past) != _Action.SYNC
    alone = last_call_over(round_with([SURVIVOR], [SURVIVOR]))
    assert EarlyJoinOp()(_RendezvousContext(SURVIVOR, alone, settings(max_nodes=2)),
                         time.monotonic() + 60) == _Action.MARK_RENDEZVOUS_COMPLETE


def test_torchs_last_call_waits_for_a_node_in_the_wait_list_too():
    """A spare (or a replacement) already moved to the wait list is as much on its way as one in
    the redundancy list; one whose heartbeat expired is not waited for."""
    waiting = last_call_over(round_with([SURVIVOR], [SURVIVOR, NEWCOMER], wait_list=[NEWCOMER]))
    assert EarlyJoinOp()(_RendezvousContext(SURVIVOR, waiting, settings(max_nodes=2)),
                         time.monotonic() + 60) == _Action.SYNC
    expired = last_call_over(round_with([SURVIVOR], [SURVIVOR], wait_list=[NEWCOMER]))
    assert EarlyJoinOp()(_RendezvousContext(SURVIVOR, expired, settings(max_nodes=2)),
                         time.monotonic() + 60) == _Action.MARK_RENDEZVOUS_COMPLETE


@pytest.mark.parametrize("complete", [True, False], ids=["before-the-survivors-restart", "in-their-next-round"])
def test_a_spare_leaving_the_redundancy_list_stays_known_and_its_join_deadline_is_renewed(complete):
    """torch's op takes a spare off the redundancy list with its heartbeat (REMOVE_FROM_REDUNDANCY_LIST),
    and only its next write adds it back: in between a survivor that knows no one else completes
    its round alone. Here the spare goes to the wait list in one write, heartbeat kept. It waited
    far longer than its join timeout as a spare; the deadline is renewed, as torch renews it."""
    state = round_with([SURVIVOR], [SURVIVOR, NEWCOMER], redundant=[NEWCOMER], complete=complete)
    ctx, stale = _RendezvousContext(NEWCOMER, state, settings(max_nodes=2)), time.monotonic() - 600
    assert _RendezvousJoinOp()(ctx, stale) == _Action.REMOVE_FROM_REDUNDANCY_LIST
    spare = EarlyJoinOp()
    assert spare(ctx, stale) == _Action.ADD_TO_WAIT_LIST
    # What torch's executor then writes (its _add_to_wait_list), as the survivor reads it:
    state.redundancy_list.discard(NEWCOMER)
    state.wait_list.add(NEWCOMER)
    assert NEWCOMER in state.last_heartbeats
    if not complete:
        survivor = _RendezvousContext(SURVIVOR, last_call_over(state), settings(max_nodes=2))
        assert EarlyJoinOp()(survivor, time.monotonic() + 60) == _Action.SYNC, "the survivor waits for the spare"
        assert spare(ctx, stale) == _Action.ADD_TO_PARTICIPANTS
        assert _RendezvousJoinOp()(ctx, stale) == _Action.ERROR_TIMEOUT  # the stale deadline would end its wait
    else:
        assert spare(ctx, stale) == _RendezvousJoinOp()(ctx, time.monotonic() + 60)


def test_after_a_loss_a_round_below_the_previous_size_waits_instead_of_completing():
    """Alone after the loss of the other node of a round of 2: torch's last call is over and every
    known node joined, yet within the bound the round neither completes early nor at torch's
    last call."""
    state = last_call_over(round_with([SURVIVOR], [SURVIVOR]))
    ctx = _RendezvousContext(SURVIVOR, state, settings())
    assert _RendezvousJoinOp()(ctx, time.monotonic() + 60) == _Action.MARK_RENDEZVOUS_COMPLETE
    assert EarlyJoinOp()(ctx, time.monotonic() + 60) == _Action.MARK_RENDEZVOUS_COMPLETE, "without the wait"
    assert EarlyJoinOp(wait=waiting_for(2, 30))(ctx, time.monotonic() + 60) == _Action.SYNC


def test_the_waiting_round_completes_at_once_when_the_replacement_joins():
    state = last_call_over(round_with([SURVIVOR, NEWCOMER], [SURVIVOR, NEWCOMER]))
    assert EarlyJoinOp(wait=waiting_for(2, 30))(_RendezvousContext(SURVIVOR, state, settings()),
                                                time.monotonic() + 60) == _Action.MARK_RENDEZVOUS_COMPLETE


def test_after_the_bound_the_round_completes_smaller():
    state = round_with([SURVIVOR], [SURVIVOR])
    wait = waiting_for(2, -0.1)
    assert not wait.holds(_RendezvousContext(SURVIVOR, state, settings()))
    assert EarlyJoinOp(wait=wait)(_RendezvousContext(SURVIVOR, state, settings()),
                                  time.monotonic() + 60) == _Action.MARK_RENDEZVOUS_COMPLETE


def test_the_bound_is_counted_from_the_notice_on_one_clock():
    wait = ReplacementWait(2, until=100.0, seconds=30)
    ctx = _RendezvousContext(SURVIVOR, round_with([SURVIVOR], [SURVIVOR]), settings())
    assert wait.holds(ctx, now=99.9) and not wait.holds(ctx, now=100.0)


def test_a_waiting_node_keeps_its_heartbeat():
    """A node that only synced while it waits would expire from the state (keep-alive), and the
    replacement would form a round without it."""
    state = last_call_over(round_with([SURVIVOR], [SURVIVOR]))
    state.last_heartbeats[SURVIVOR] -= timedelta(seconds=10)  # over the 2 s keep-alive interval
    assert EarlyJoinOp(wait=waiting_for(2, 30))(_RendezvousContext(SURVIVOR, state, settings()),
                                                time.monotonic() + 60) == _Action.KEEP_ALIVE


def test_a_node_that_is_no_participant_yet_joins_as_torch_says_while_the_round_waits():
    state = round_with([SURVIVOR], [SURVIVOR, NEWCOMER])
    ctx = _RendezvousContext(NEWCOMER, state, settings())
    assert EarlyJoinOp(wait=waiting_for(2, 30))(ctx, time.monotonic() + 60) == _Action.ADD_TO_PARTICIPANTS


class NoticedLoss:
    """The handler's LossNotice as a fake: reports one lost peer once, when `lose()` was called
    (the real one watches beacons over sockets, tests/rendezvous/test_loss_notice.py)."""

    def __init__(self):
        self.lost, self.acted = [], []

    def lose(self, node: str) -> None:
        self.lost = [node]

    def check(self):
        lost, self.lost = self.lost, []
        return lost

    def act(self, lost):
        self.acted.append(lost)

    def forget(self):
        pass

    def round_formed(self, participants):
        pass

    def stop(self):
        pass


def in_thread(results: dict, name: str, handler) -> "threading.Thread":
    import threading

    def rendezvous():
        started = time.monotonic()
        results[name] = (handler.next_rendezvous(), time.monotonic() - started)

    thread = threading.Thread(target=rendezvous, daemon=True)
    thread.start()
    return thread


def two_node_group(monkeypatch, wait_seconds: int):
    """Two handlers on one in-process store (min 1, max 4, a 1 s last call) in a round of 2,
    each waiting `wait_seconds` for a replacement after a noticed loss; their fake notices.

    As in the pods (render/launch.py): the agents do not share their rendezvous store with the
    workers. Shared, torch's rank 0 of an earlier round publishes the workers' store address only
    once, and a replacement joining a later round would wait for it forever."""
    monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    store = HashStore()
    backend = C10dRendezvousBackend(store, "run")

    def handler():
        plain = DynamicRendezvousHandler.from_backend("run", store, backend, 1, 4, "localhost",
                                                      RendezvousTimeout(last_call=timedelta(seconds=1)))
        made = EarlyRendezvousHandler.like(plain, replacement_wait=wait_seconds)
        made.notice.stop()
        made.notice = NoticedLoss()
        return made

    survivor, lost = handler(), handler()
    results = {}
    for thread in [in_thread(results, "survivor", survivor), in_thread(results, "lost", lost)]:
        thread.join(timeout=30)
    assert results["survivor"][0].world_size == 2
    return store, backend, survivor, lost, handler


def lose(survivor, lost) -> None:
    """`lost`'s agent dies (drop) and the survivor's notice reports it."""
    drop(lost)
    survivor.notice.lose("lost")
    assert survivor.num_nodes_waiting() == 1 and survivor.notice.acted == [["lost"]]


def test_after_a_noticed_loss_the_survivor_waits_for_the_replacement_and_they_form_one_round_of_the_old_size(
        monkeypatch):
    """Through torch's executor: the survivor's next round outlasts torch's 1 s last call while it
    waits, and completes with the replacement the moment it joins, well inside the 30 s bound."""
    _, _, survivor, lost, make = two_node_group(monkeypatch, wait_seconds=30)
    lose(survivor, lost)
    results = {}
    waiting = in_thread(results, "survivor", survivor)
    time.sleep(3)  # three last calls
    assert "survivor" not in results, "the round completed at reduced size during the wait"
    replacement = make()
    in_thread(results, "replacement", replacement).join(timeout=30)
    waiting.join(timeout=30)
    assert results["survivor"][0].world_size == results["replacement"][0].world_size == 2
    assert results["survivor"][1] < 30 - 5, "completed by the replacement, not by the bound"
    for h in (survivor, replacement):
        h.shutdown()


def test_without_a_replacement_the_survivor_goes_on_alone_after_the_bound(monkeypatch):
    _, _, survivor, lost, _ = two_node_group(monkeypatch, wait_seconds=2)
    lose(survivor, lost)
    results = {}
    in_thread(results, "survivor", survivor).join(timeout=30)
    info, seconds = results["survivor"]
    assert info.world_size == 1 and 2 <= seconds < 2 + 10, seconds
    survivor.shutdown()


def test_a_round_after_no_noticed_loss_does_not_wait(monkeypatch):
    """A peer that left on purpose (or whose loss only its workers saw) is not waited for."""
    _, _, survivor, lost, _ = two_node_group(monkeypatch, wait_seconds=30)
    drop(lost)
    results = {}
    in_thread(results, "survivor", survivor).join(timeout=30)
    info, seconds = results["survivor"]
    assert info.world_size == 1 and seconds < 10, seconds
    survivor.shutdown()


@pytest.mark.parametrize("value", ["-1", "301", "2.5", "abc", "²"])
def test_a_bad_replacement_wait_is_refused_naming_key_value_and_rule(value):
    from ddpjob_rdzv.contract import replacement_wait_seconds

    with pytest.raises(ValueError) as error:
        replacement_wait_seconds({"replacement_wait": value})
    assert str(error.value) == (f"rdzv_conf replacement_wait ({value!r}) must be an integer number of "
                                "seconds from 0 to 300")


def test_a_long_replacement_wait_is_quoted_by_its_start():
    from ddpjob_rdzv.contract import replacement_wait_seconds

    with pytest.raises(ValueError) as error:
        replacement_wait_seconds({"replacement_wait": "9" * 5000})
    assert str(error.value) == (f"rdzv_conf replacement_wait ({'9' * 40 + '...'!r}) must be an integer number "
                                "of seconds from 0 to 300")


def test_replacement_wait_reads_absent_as_zero_and_takes_the_bounds():
    from ddpjob_rdzv.contract import replacement_wait_seconds

    assert [replacement_wait_seconds(conf) for conf in ({}, {"replacement_wait": ""}, {"replacement_wait": "0"},
                                                         {"replacement_wait": " 300 "})] == [0, 0, 0, 300]
