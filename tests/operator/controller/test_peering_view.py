"""The operator's own view of kopf's peering (controller/peering.py): the same rule as kopf's over
the same object, so that a standby replica's cache watches start no pass; a wait for the object
at start-up, so that kopf's first keep-alive lands; every job passed when this replica takes
over. Fake APIs stand in for the cluster; the replicas themselves are
tests/cluster/e2e/test_operator_peering.py's."""
from __future__ import annotations

import asyncio
import datetime

import pytest
from kopf._core.engines.peering import Peer

from ddpjob_operator.controller import kube, passes as passes_module
from ddpjob_operator.controller.cache import ClusterCache
from ddpjob_operator.controller.main import parse_args, peering_identity
from ddpjob_operator.controller.passes import JobPasses, PassOutcome
from ddpjob_operator.controller.peering import Peering, PeeringView, acts, wait_until_present
from ddpjob_operator.controller.state import OperatorState, PassContext
from ddpjob_sandbox.jobs import make_ddpjob

NOW = datetime.datetime(2026, 11, 26, 12, 0, tzinfo=datetime.UTC)
ME = Peering("ddpjob-operator", "operator-b", priority=100, namespaces=("team-a",))


def peer(priority: int, seconds_ago: float = 0.0, lifetime: int = 60) -> dict:
    """One peer as kopf's own keep-alive writes it (kopf's Peer.as_dict)."""
    lastseen = (NOW - datetime.timedelta(seconds=seconds_ago)).isoformat()
    return Peer(identity="x", priority=priority, lifetime=lifetime, lastseen=lastseen).as_dict()


@pytest.mark.parametrize("status,acting", [
    ({}, True),  # an object without peers: kopf acts too (why the object must exist before its keep-alive)
    ({"operator-b": peer(100)}, True),  # only itself
    ({"operator-a": peer(200)}, False),  # a live, older replica acts
    ({"operator-a": peer(200, seconds_ago=61)}, True),  # ... dead: its lifetime is over
    ({"operator-a": peer(50)}, True),  # a younger replica stands by for this one
    ({"operator-a": peer(100)}, False),  # the same priority: kopf pauses both
    ({"operator-a": "not a peer", "operator-c": {"priority": "high"}, "operator-d": {"lastseen": "yesterday"}}, True),
])
def test_this_replica_acts_unless_a_live_peer_ranks_at_least_as_high(status, acting):
    assert acts(status, ME, NOW)[0] is acting


def test_the_view_looks_again_when_the_blocking_peer_expires():
    assert acts({"operator-a": peer(200, seconds_ago=45), "operator-c": peer(300, seconds_ago=10)}, ME, NOW) == (
        False, 15.0)


class FakeApi:
    """The peering object as a list answers it, then the watch's events, each once the test
    releases it (``events``)."""

    def __init__(self, found: list[list[dict]]):
        self.found, self.lists, self.events = found, 0, asyncio.Queue()

    async def list_objects(self, api_version, plural, namespace, label_selector="", field_selector=""):
        assert (api_version, plural, field_selector) == ("kopf.dev/v1", "kopfpeerings", "metadata.name=ddpjob-operator")
        self.lists += 1
        return (self.found.pop(0) if len(self.found) > 1 else self.found[0]), "7"

    find_by_name = kube.Kube.find_by_name  # the real one, through list_objects above

    async def watch(self, api_version, plural, namespace, label_selector, version, seconds, field_selector=""):
        while True:
            yield await self.events.get()


async def until(predicate, what: str, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, f"not within {timeout} s: {what}"
        await asyncio.sleep(0.005)


def peering_object(status: dict) -> dict:
    return {"metadata": {"name": "ddpjob-operator", "namespace": "team-a", "resourceVersion": "8"}, "status": status}


def test_a_replica_stands_by_until_the_object_says_it_acts_and_is_told_once_when_it_takes_over():
    async def scenario():
        api, took_over = FakeApi([[peering_object({"operator-a": peer(200)})]]), []
        view = PeeringView(api, ME, on_active=lambda: took_over.append(view.active), clock=lambda: NOW)
        states = [view.active]  # before any read: kopf starts paused too
        view.start()
        await until(lambda: api.lists == 1, "the list")
        await asyncio.sleep(0)
        states.append(view.active)  # the older replica acts
        api.events.put_nowait({"type": "MODIFIED", "object": peering_object({"operator-b": peer(100)})})
        await until(lambda: view.active, "taking over once the older replica left")
        api.events.put_nowait({"type": "MODIFIED", "object": peering_object({"operator-b": peer(100)})})
        await until(lambda: api.events.empty(), "the same status again")
        await view.stop()
        return states, took_over
    assert asyncio.run(scenario()) == ([False, False], [True])


def test_a_blocking_peer_that_stops_heartbeating_hands_over_without_an_event():
    async def scenario():
        clock = [NOW]
        api = FakeApi([[peering_object({"operator-a": peer(200, seconds_ago=59.9)})]])
        view = PeeringView(api, ME, clock=lambda: clock[0])
        view.start()
        await until(lambda: api.lists == 1, "the list")
        await asyncio.sleep(0)
        before = view.active
        clock[0] = NOW + datetime.timedelta(seconds=1)  # its lifetime is over; no event comes
        await until(lambda: view.active, "acting after the older replica's lifetime")
        await view.stop()
        return before
    assert asyncio.run(scenario()) is False


def test_start_up_waits_for_the_peering_object_and_gives_up_naming_it():
    api = FakeApi([[], [], [peering_object({})]])
    asyncio.run(wait_until_present(api, ME, timeout=5, poll=0.01))
    assert api.lists == 3
    with pytest.raises(LookupError, match=r"--peering ddpjob-operator: KopfPeering 'ddpjob-operator' in namespace "
                                          r"'team-a' does not exist after 0 s; .* Create it \(the chart does"):
        asyncio.run(wait_until_present(FakeApi([[]]), ME, timeout=0.05, poll=0.01))


@pytest.fixture
def passes_run(monkeypatch):
    """A pass that records its job, at once after a poke."""
    monkeypatch.setattr(passes_module, "COALESCE_SECONDS", 0.0)
    ran: list[tuple[str, str]] = []

    async def run(key):
        ran.append(key)
        return PassOutcome()
    return ran, run


def test_a_standby_replicas_pokes_start_no_pass(passes_run):
    ran, run = passes_run

    async def scenario():
        acting = [False]
        jobs = JobPasses(run, acting=lambda: acting[0])
        jobs.poke(("ns", "standing-by"))
        jobs.schedule(("ns", "timer"), 0.0)  # its poke comes at the loop's next turn, before the sleep ends
        await asyncio.sleep(0.01)
        acting[0] = True
        jobs.poke(("ns", "acting"))
        await until(lambda: ran, "the pass once acting")
    asyncio.run(scenario())
    assert ran == [("ns", "acting")]


def test_taking_over_passes_every_job_the_cache_holds(passes_run):
    ran, run = passes_run

    async def scenario():
        cache = ClusterCache(api=None)
        for synced in cache._synced.values():
            synced.set()
        for name in ("a", "b"):
            cache.offer(make_ddpjob(name, namespace="team-a", uid=f"uid-{name}"))
        state = OperatorState(PassContext(None, cache), JobPasses(run))
        state._pass_every_job()
        await until(lambda: len(ran) == 2, "a pass of each job")
    asyncio.run(scenario())
    assert sorted(ran) == [("team-a", "a"), ("team-a", "b")]


def test_peering_names_each_replica_as_kopf_does_and_refuses_namespace_patterns(monkeypatch, capsys):
    monkeypatch.setenv("POD_ID", "ddpjob-operator-7d9c-x2")
    assert peering_identity() == "ddpjob-operator-7d9c-x2"
    monkeypatch.delenv("POD_ID")
    assert peering_identity() != peering_identity()  # two processes on one host never share one
    with pytest.raises(SystemExit):
        parse_args(["--peering", "ddpjob-operator", "--namespace", "team-*"])
    assert "--peering with a namespace pattern (team-*) is not supported" in capsys.readouterr().err
