"""The key cleanup dials the user's etcd endpoints outside any reconcile pass, a few at a time,
and gives up on one that never answers (controller/etcd_cleanup.py). A fake etcd client
(``delete_keys``) that blocks stands in for an endpoint that hangs."""
from __future__ import annotations

import asyncio
import threading
import time


from ddpjob_operator.api import constants as C
from ddpjob_operator.controller import etcd_cleanup
from ddpjob_operator.controller.etcd_cleanup import RendezvousCleaner
from ddpjob_operator.decide.rendezvous_keys import of_body
from ddpjob_sandbox.jobs import make_ddpjob

V3 = {"rdzvBackend": "etcd-v3", "rdzvEndpoints": ["10.0.0.1:2379"]}  # never dialled: delete_keys is faked


class Events:
    """The API as the cleaner uses it: it only posts Events here."""

    def __init__(self):
        self.posted: list[tuple[str, str, str]] = []

    async def post_event(self, job, event_type, reason, message):
        self.posted.append((job["metadata"]["name"], reason, message))


class HangingEtcd:
    """delete_keys that blocks until released, counting the dials under way."""

    def __init__(self):
        self.release, self.lock = threading.Event(), threading.Lock()
        self.running = self.most = self.calls = 0

    def __call__(self, target, credentials_dir, timeout):
        with self.lock:
            self.running, self.calls = self.running + 1, self.calls + 1
            self.most = max(self.most, self.running)
        try:
            self.release.wait(10)
            return 1
        finally:
            with self.lock:
                self.running -= 1


def finished(name: str) -> tuple[dict, object]:
    """A finished job and the DeleteRendezvousKeys its pass returned."""
    job = make_ddpjob(name=name, uid=f"uid-{name}", elasticPolicy=V3, status={"phase": C.PHASE_SUCCEEDED})
    return job, of_body(job)


async def until(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        await asyncio.sleep(0.01)


def test_a_finished_jobs_cleanup_starts_without_holding_the_pass_and_at_most_a_few_dial_at_once(monkeypatch):
    etcd = HangingEtcd()
    monkeypatch.setattr(etcd_cleanup, "delete_keys", etcd)

    async def scenario():
        cleaner = RendezvousCleaner(Events(), concurrency=2)
        started = time.monotonic()
        for n in range(5):  # the passes of five jobs that just finished
            cleaner.start(*finished(f"job{n}"))
        returned = time.monotonic() - started
        await until(lambda: etcd.running == 2)
        await asyncio.sleep(0.2)  # room for a third dial, were the bound missing
        most_while_hanging = etcd.most
        etcd.release.set()
        await cleaner.idle()
        cleaner.close()
        return returned, most_while_hanging
    returned, most = asyncio.run(asyncio.wait_for(scenario(), 20))
    assert returned < 0.5, "a pass waited for the user's etcd"
    assert most == 2 and etcd.calls == 5


def test_an_endpoint_that_never_answers_is_given_up_after_its_timeout_and_frees_the_slot(monkeypatch):
    etcd = HangingEtcd()
    monkeypatch.setattr(etcd_cleanup, "delete_keys", etcd)
    monkeypatch.setenv(etcd_cleanup.TIMEOUT_ENV, "0.2")
    monkeypatch.setattr(etcd_cleanup, "GRACE_SECONDS", 0.1)

    async def scenario():
        api = Events()
        cleaner = RendezvousCleaner(api, concurrency=1)
        started = time.monotonic()
        cleaner.start(*finished("hangs"))
        await cleaner.idle()
        took = time.monotonic() - started
        etcd.release.set()
        cleaner.close()
        return api.posted, took
    posted, took = asyncio.run(asyncio.wait_for(scenario(), 20))
    assert took < 3
    [(name, reason, message)] = posted
    assert (name, reason) == ("hangs", etcd_cleanup.REASON_CLEANUP_FAILED)
    assert "at 10.0.0.1:2379 (spec.elasticPolicy.rdzvEndpoints): no answer within 0.3s (DDPJOB_RDZV_CLEANUP_TIMEOUT_SECONDS=0.2s + 0.1s)" in message
    assert message.endswith("the operator tries again when the job is deleted")


def test_start_is_a_plain_call_that_a_pass_never_awaits_and_runs_once_per_job(monkeypatch):
    calls = []
    monkeypatch.setattr(etcd_cleanup, "delete_keys", lambda *a: calls.append(a) or 3)

    async def scenario():
        api = Events()
        cleaner = RendezvousCleaner(api)
        results = [cleaner.start(*finished("mlp")) for _ in range(3)]  # every pass of the finished job says so
        await cleaner.idle()
        cleaner.close()
        return results, api.posted
    results, posted = asyncio.run(scenario())
    assert results == [None] * 3 and len(calls) == 1
    assert [(name, reason) for name, reason, _ in posted] == [("mlp", etcd_cleanup.REASON_CLEANED)]
