"""A node whose agent is gone leaves the rendezvous at once, not after its keep-alive expired
(ddpjob_trainer.rendezvous.liveness), and a live node is never taken for a dead one."""
import json
import os
import socket
import threading
import time
from datetime import datetime, timedelta, timezone

from torch.distributed import HashStore
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
    DynamicRendezvousHandler, RendezvousSettings, RendezvousTimeout, _Action, _NodeDesc, _RendezvousContext,
    _RendezvousState,
)

from ddpjob_trainer.rendezvous.early import EarlyJoinOp, EarlyRendezvousHandler
from ddpjob_trainer.rendezvous.liveness import KEY_PREFIX, Beacon, Liveness, network_namespace, probe
from tests.support.listeners import listeners

SURVIVOR, DEAD, LATE, QUIET = (_NodeDesc("127.0.0.1", pid, 0) for pid in (1, 2, 3, 4))
INTERVAL = timedelta(seconds=2)


def settings(min_nodes=1, max_nodes=4) -> RendezvousSettings:
    return RendezvousSettings("run", min_nodes, max_nodes, RendezvousTimeout(), keep_alive_interval=INTERVAL,
                              keep_alive_max_attempt=3)


def test_a_beacon_answers_its_token_and_is_refused_once_closed():
    beacon = Beacon("token-of-node-7")
    assert probe("127.0.0.1", beacon.port, "token-of-node-7") is True
    assert probe("127.0.0.1", beacon.port, "token-of-node-8") is False, "another node's beacon on that port"
    beacon.close()
    assert probe("127.0.0.1", beacon.port, "token-of-node-7") is False


def test_a_host_that_accepts_but_never_answers_is_unknown_not_gone():
    silent = socket.create_server(("127.0.0.1", 0))  # the kernel accepts; nobody ever writes
    try:
        assert probe("127.0.0.1", silent.getsockname()[1], "node_7_0", timeout=0.2) is None
    finally:
        silent.close()


class Published:
    """Beacons for nodes, published in one store the way each node's Liveness publishes its own."""

    def __init__(self):
        self.store, self.beacons = HashStore(), {}

    def alive(self, node):
        Liveness(self.store, node, settings()).start()  # publishes under the node's name
        return self

    def dead(self, node):
        beacon = Liveness(self.store, node, settings())
        beacon.start()
        beacon.stop()
        return self


def heartbeats(**seconds_ago) -> _RendezvousState:
    state, now = _RendezvousState(), datetime.now(timezone.utc)
    nodes = {"survivor": SURVIVOR, "dead": DEAD, "late": LATE, "quiet": QUIET}
    state.last_heartbeats = {nodes[name]: now - timedelta(seconds=age) for name, age in seconds_ago.items()}
    state.participants = {node: rank for rank, node in enumerate(state.last_heartbeats)}
    return state


def test_only_a_node_that_missed_a_heartbeat_and_whose_beacon_is_gone_is_gone():
    published = Published().alive(SURVIVOR).dead(DEAD).alive(LATE)
    state = heartbeats(survivor=0, dead=3, late=3, quiet=3)  # QUIET never published a beacon
    assert Liveness(published.store, SURVIVOR, settings()).gone(state) == [DEAD]


def answer_forever(server: socket.socket, answer: bytes) -> None:
    while True:
        try:
            connection, _ = server.accept()
        except OSError:
            return
        with connection:
            connection.sendall(answer)


def test_another_listener_answering_with_the_nodes_name_is_not_that_node():
    """The dead node's port taken by another process that answers with the node's name (all
    the old probe compared): the token does not match, so the node is gone."""
    store = HashStore()
    liveness = Liveness(store, DEAD, settings())
    liveness.start()
    port = json.loads(store.get(KEY_PREFIX + repr(DEAD)))["port"]
    liveness.stop()
    impostor = socket.create_server(("127.0.0.1", port))
    threading.Thread(target=answer_forever, args=(impostor, repr(DEAD).encode()), daemon=True).start()
    try:
        Liveness(store, SURVIVOR, settings()).start()
        assert Liveness(store, SURVIVOR, settings()).gone(heartbeats(survivor=0, dead=3)) == [DEAD]
    finally:
        impostor.close()


def test_a_node_is_probed_at_its_published_address_not_by_its_name(monkeypatch):
    """A name that resolves nowhere (or, with DNS spoofed, somewhere else) does not matter: the
    probe goes to the address the node published."""
    unresolvable = _NodeDesc("node-0.ddpjob.invalid", 5, 0)
    store = HashStore()
    monkeypatch.setenv("DDPJOB_LISTEN_HOST", "127.0.0.1")
    node = Liveness(store, unresolvable, settings())
    node.start()
    monkeypatch.delenv("DDPJOB_LISTEN_HOST")
    published = json.loads(store.get(KEY_PREFIX + repr(unresolvable)))
    assert published["addr"] == "127.0.0.1" and len(published["token"]) == 32, published
    state = _RendezvousState()
    state.last_heartbeats = {SURVIVOR: datetime.now(timezone.utc),
                             unresolvable: datetime.now(timezone.utc) - timedelta(seconds=3)}
    survivor = Liveness(store, SURVIVOR, settings())
    assert survivor._probe(unresolvable) is True, "alive at its published address"
    node.stop()
    assert survivor.gone(state) == [unresolvable]


def test_a_loopback_address_published_from_another_network_namespace_is_unknown_not_gone():
    """Another machine's node that published 127.0.1.1 (its name in Debian's /etc/hosts): probing
    it here would ask this machine's loopback, whose refusal says nothing about that node."""
    store = HashStore()
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there now: a probe here is refused
    store.set(KEY_PREFIX + repr(DEAD), json.dumps({"addr": "127.0.0.1", "port": port, "token": "t" * 32,
                                                   "netns": "another-boot/4026531840"}))
    assert Liveness(store, SURVIVOR, settings()).gone(heartbeats(survivor=0, dead=3)) == []
    store.set(KEY_PREFIX + repr(DEAD), json.dumps({"addr": "127.0.0.1", "port": port, "token": "t" * 32,
                                                   "netns": network_namespace()}))
    assert Liveness(store, SURVIVOR, settings()).gone(heartbeats(survivor=0, dead=3)) == [DEAD], "same namespace"


def test_the_beacon_listens_on_ddpjob_listen_host_only(monkeypatch):
    monkeypatch.setenv("DDPJOB_LISTEN_HOST", "127.0.0.1")
    store = HashStore()
    liveness = Liveness(store, QUIET, settings())
    liveness.start()
    try:
        port = json.loads(store.get(KEY_PREFIX + repr(QUIET)))["port"]
        assert [(s.address, s.port) for s in listeners({os.getpid()}) if s.port == port] == [("127.0.0.1", port)]
    finally:
        liveness.stop()


def test_a_dead_node_is_not_probed_before_it_has_missed_a_heartbeat():
    published = Published().alive(SURVIVOR).dead(DEAD)
    assert Liveness(published.store, SURVIVOR, settings()).gone(heartbeats(survivor=0, dead=0.5)) == []


def test_a_suspect_is_probed_before_it_has_missed_a_heartbeat_and_only_once():
    """A node whose beacon this node saw close (.notice hands it over) is probed at once: gone
    if refused. One that answers is a suspect no longer: it waits for a missed heartbeat again."""
    published = Published().alive(SURVIVOR).dead(DEAD)
    liveness = Liveness(published.store, SURVIVOR, settings())
    liveness.suspect([repr(DEAD)])
    assert liveness.gone(heartbeats(survivor=0, dead=0.5)) == [DEAD]

    alive = Liveness(published.store, LATE, settings())
    alive.start()
    liveness.suspect([repr(LATE)])
    assert liveness.gone(heartbeats(survivor=0, late=0.5)) == [], "its beacon answered its token"
    alive.stop()  # gone now, but a suspect no longer, and its heartbeat is fresh: not probed
    assert liveness.gone(heartbeats(survivor=0, late=0.5)) == []


def test_the_join_removes_a_gone_participant_and_moves_a_complete_round_on():
    """The survivor waits for the round its dead peer still holds: the join removes the peer and,
    its round now empty, torch's epilogue starts the next one (as keep-alive expiry would)."""
    published = Published().alive(SURVIVOR).dead(DEAD)
    state = heartbeats(survivor=0, dead=3)
    del state.participants[SURVIVOR]
    state.complete, state.round, state.wait_list = True, 4, {SURVIVOR}
    dirty = []
    op = EarlyJoinOp(Liveness(published.store, SURVIVOR, settings()), lambda: dirty.append(True))
    assert op(_RendezvousContext(SURVIVOR, state, settings()), time.monotonic() + 60) == _Action.KEEP_ALIVE
    assert dirty and DEAD not in state.last_heartbeats and not state.participants
    assert (state.round, state.complete) == (5, False)


def handlers(count: int, *, min_nodes: int, join_seconds: int = 30,
             keep_alive_seconds: int = 1) -> list[EarlyRendezvousHandler]:
    """Handlers of one rendezvous on one in-process store, keep-alive ``keep_alive_seconds`` x 1000:
    a dead node would take 1000 intervals to expire, longer than the join timeout."""
    store = HashStore()
    backend = C10dRendezvousBackend(store, "run")
    timeout = RendezvousTimeout(join=timedelta(seconds=join_seconds), last_call=timedelta(seconds=1))
    return [EarlyRendezvousHandler.like(DynamicRendezvousHandler.from_backend(
        "run", store, backend, min_nodes, count, "127.0.0.1", timeout, keep_alive_interval=keep_alive_seconds,
        keep_alive_max_attempt=1000)) for _ in range(count)]


def rendezvous_together(group):
    results = [None] * len(group)

    def join(i):
        results[i] = group[i].next_rendezvous()

    threads = [threading.Thread(target=join, args=(i,)) for i in range(len(group))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results


def test_the_survivor_re_forms_alone_although_the_dead_nodes_keep_alive_never_expires():
    survivor, dead = handlers(2, min_nodes=1)
    assert sorted(info.world_size for info in rendezvous_together([survivor, dead])) == [2, 2]
    dead._stop_heartbeats()  # what a SIGKILL does to the agent: no more heartbeats, the beacon closed
    dead.liveness.stop()
    info = survivor.next_rendezvous()
    assert (info.rank, info.world_size) == (0, 1)
    survivor.shutdown()


def test_a_live_node_that_is_only_late_is_waited_for():
    """The same, with the other node alive but silent (its heartbeats stopped, its beacon up):
    the round is not formed without it, and the join times out."""
    survivor, late = handlers(2, min_nodes=1, join_seconds=4)
    rendezvous_together([survivor, late])
    late._stop_heartbeats()
    started = time.monotonic()
    try:
        survivor.next_rendezvous()
    except Exception as error:  # noqa: BLE001 - torch's RendezvousTimeoutError
        assert type(error).__name__ == "RendezvousTimeoutError", error
    else:
        raise AssertionError("the survivor formed a round without its live peer")
    assert time.monotonic() - started >= 4
    late.liveness.stop()


class RecordingWarmUp:
    """Stands in for the node's prestarted fork server (zygote.Warm): records, when it is
    waited for, whether the node had joined the rendezvous yet."""

    def __init__(self, handler_of):
        self.handler_of, self.joined_when_waited = handler_of, []

    def wait(self):
        handler = self.handler_of()
        handler._state_holder.sync()
        state = handler._state_holder.state
        self.joined_when_waited.append(handler._this_node in {*state.participants, *state.wait_list})
        return True


def test_a_node_joining_a_running_group_warms_up_before_it_joins_and_a_starting_one_does_not(monkeypatch):
    monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")  # as on every agent (DEVELOPERS.md)
    first, newcomer = handlers(2, min_nodes=1)
    first_warm, newcomer_warm = RecordingWarmUp(lambda: first), RecordingWarmUp(lambda: newcomer)
    first._warm, newcomer._warm = first_warm, newcomer_warm
    assert not first.membership_known, "a job's first round: nodes may still be starting"
    assert first.next_rendezvous().world_size == 1  # alone: the group starts (last call 1 s)
    assert first_warm.joined_when_waited == [], "nothing runs yet: the first node joins at once"
    joined = []
    thread = threading.Thread(target=lambda: joined.append(newcomer.next_rendezvous()))
    thread.start()
    # As an agent does: it restarts its workers once it sees a node waiting (num_nodes_waiting).
    deadline = time.monotonic() + 30
    while first.num_nodes_waiting() == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert first.next_rendezvous().world_size == 2
    thread.join(30)
    assert [info.world_size for info in joined] == [2]
    assert newcomer_warm.joined_when_waited == [False], "warmed up once, before joining"
    assert newcomer.membership_known, "a node that joined a running group completes its rounds early"


class NotYetStore:
    """etcd-v3's store before the first round's state exists: every write fails until then."""

    def __init__(self):
        self.ready, self.values = False, {}

    def set(self, key, value):
        if not self.ready:
            raise RuntimeError("the store is only valid after a rendezvous")
        self.values[key] = value


def test_a_beacon_the_store_refused_before_the_first_round_is_published_once_it_formed():
    store = NotYetStore()
    liveness = Liveness(store, DEAD, settings())
    liveness.start()
    try:
        assert store.values == {}, "the round's state does not exist yet"
        store.ready = True
        liveness.publish()  # what the handler does once next_rendezvous returns
        published = json.loads(store.values[KEY_PREFIX + repr(DEAD)])
        assert probe(published["addr"], published["port"], published["token"]) is True
    finally:
        liveness.stop()
