"""A survivor's agent stops its workers the moment a peer of its round is lost
(ddpjob_trainer.rendezvous.notice), and not when a peer stops on purpose."""
import json
import signal
import subprocess
import sys
import time

import pytest
from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc

from ddpjob_trainer.rendezvous.liveness import KEY_PREFIX, network_namespace
from ddpjob_trainer.rendezvous.notice import peers_to_watch
from tests.rendezvous.test_beacon_watch import FAKE_BEACON, eventually, start_peer
from tests.rendezvous.test_liveness import handlers, rendezvous_together

NODES = [_NodeDesc("n", pid, 0) for pid in range(6)]


@pytest.mark.parametrize("ranks, me, limit, want", [
    ([0, 1], 0, 64, [1]),
    ([0, 1], 1, 64, [0]),
    ([0, 1, 2, 3, 4, 5], 4, 3, [5, 0, 1]),  # the ring's next three: every node watched by three
    ([0], 0, 64, []),
])
def test_a_node_watches_the_peers_that_follow_it_round_the_ring(ranks, me, limit, want):
    participants = {NODES[rank]: rank for rank in ranks}
    assert peers_to_watch(participants, NODES[me], limit) == [NODES[rank] for rank in want]


def test_every_node_is_watched_by_as_many_peers_whatever_the_group_size():
    participants = {NODES[rank]: rank for rank in range(6)}
    watchers = {node: 0 for node in participants}
    for node in participants:
        for watched in peers_to_watch(participants, node, limit=2):
            watchers[watched] += 1
    assert set(watchers.values()) == {2}


class FakeAgent(SimpleElasticAgent):
    """torch's agent as the handler sees it: its monitor loop asks num_nodes_waiting, and its
    process context holds the workers it started (here: sleepers in sessions of their own)."""

    def __init__(self, handler, workers):  # noqa: D107 - no torch agent set-up needed here
        self.handler = handler
        self._pcontext = type("Context", (), {"subprocess_handlers": {
            rank: type("Handler", (), {"proc": proc})() for rank, proc in enumerate(workers)}})()

    def monitor_tick(self) -> int:
        return self.handler.num_nodes_waiting()

    _stop_workers = _start_workers = _monitor_workers = _shutdown = lambda *a, **k: None


def sleepers(count: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
            for _ in range(count)]


@pytest.fixture()
def round_of_two():
    """A survivor and a peer in a complete round; the peer's published beacon replaced by a
    plain process that answers its token (SIGKILLable like an agent, without importing torch)."""
    survivor, peer = handlers(2, min_nodes=1)
    rendezvous_together([survivor, peer])
    yield survivor, peer
    survivor.shutdown()
    peer.shutdown()


def fake_beacon_for(handler) -> subprocess.Popen:
    token = "t" * 32
    process, port = start_peer(FAKE_BEACON, token)
    handler._store.set(KEY_PREFIX + repr(handler._this_node),
                       json.dumps({"addr": "127.0.0.1", "port": port, "token": token,
                                   "netns": network_namespace()}))
    return process


def test_a_lost_peer_stops_this_nodes_workers_at_once_and_restarts_them(round_of_two):
    survivor, peer = round_of_two
    dead = fake_beacon_for(peer)
    workers = sleepers(2)
    agent = FakeAgent(survivor, workers)
    try:
        assert agent.monitor_tick() == 0, "the first tick starts watching"
        time.sleep(0.3)
        assert agent.monitor_tick() == 0, "the peer lives"
        dead.send_signal(signal.SIGKILL)
        assert eventually(agent.monitor_tick, 1) == 1
        assert [worker.wait(timeout=10) for worker in workers] == [-signal.SIGKILL] * 2
        notice, = survivor.notice.notices
        assert (notice.cause, notice.nodes) == ("beacon closed", (repr(peer._this_node),))
        assert sorted(notice.stopped_pids) == sorted(worker.pid for worker in workers)
    finally:
        for process in (dead, *workers):
            process.kill()
            process.wait()


def test_a_peer_that_stops_on_purpose_leaves_the_workers_running(round_of_two):
    """A clean finish, a graceful stop, a scale-down: the peer's beacon says LEAVING."""
    survivor, peer = round_of_two
    workers = sleepers(1)
    agent = FakeAgent(survivor, workers)
    try:
        assert agent.monitor_tick() == 0
        time.sleep(0.3)
        peer.liveness.stop()
        assert eventually(survivor.notice.watch.left, [repr(peer._this_node)]) == [repr(peer._this_node)]
        assert agent.monitor_tick() == 0
        assert workers[0].poll() is None and survivor.notice.notices == []
    finally:
        workers[0].kill()
        workers[0].wait()


def test_a_loss_after_this_node_left_its_round_stops_nothing(round_of_two):
    survivor, peer = round_of_two
    dead = fake_beacon_for(peer)
    workers = sleepers(1)
    agent = FakeAgent(survivor, workers)
    try:
        assert agent.monitor_tick() == 0
        time.sleep(0.3)
        survivor.notice.forget()  # what next_rendezvous does first
        dead.send_signal(signal.SIGKILL)
        dead.wait()
        time.sleep(0.5)
        assert survivor.notice.check() == [] and workers[0].poll() is None
    finally:
        for process in (dead, *workers):
            process.kill()
            process.wait()


@pytest.mark.parametrize("acted", [True, False], ids=["notice-acted", "worker-failed-first"])
def test_the_next_round_drops_the_lost_peer_without_waiting_for_its_heartbeat_to_age(acted):
    """The lost peer's last heartbeat is fresh (keep-alive 60 s; the join times out in 10 s): the
    survivor re-forms alone only because its notice handed the peer to liveness as a suspect,
    whether the notice stopped the workers (acted) or a worker failed first and the agent
    re-rendezvoused without asking (next_rendezvous forgets the watch, handing over what it saw)."""
    survivor, peer = handlers(2, min_nodes=1, join_seconds=10, keep_alive_seconds=60)
    rendezvous_together([survivor, peer])
    dead = fake_beacon_for(peer)
    workers = sleepers(1)
    agent = FakeAgent(survivor, workers)
    try:
        assert agent.monitor_tick() == 0, "the first tick starts watching"
        time.sleep(0.3)
        peer._stop_heartbeats()
        dead.send_signal(signal.SIGKILL)
        assert eventually(survivor.notice.watch.lost, [repr(peer._this_node)]) == [repr(peer._this_node)]
        if acted:
            assert agent.monitor_tick() == 1
        info = survivor.next_rendezvous()
        assert (info.rank, info.world_size) == (0, 1)
        assert peer._this_node not in survivor._state_holder.state.last_heartbeats
    finally:
        for process in (dead, *workers):
            process.kill()
            process.wait()
        survivor.shutdown()
        peer.shutdown()
