"""JobPasses: passes of one job never overlap, pod events are coalesced, requeues keep the
earliest time, a failed pass is retried after a delay that doubles per failure in a row of
that job, a deleted job is forgotten."""
import asyncio

import kopf
import pytest

from ddpjob_operator.controller import apply, handlers, kube
from ddpjob_operator.controller.backoff import Backoff
from ddpjob_operator.controller.cache import ClusterCache
from ddpjob_operator.controller.passes import COALESCE_SECONDS, JobPasses, PassOutcome
from ddpjob_operator.controller.state import OperatorState, PassContext

KEY = ("ns", "mlp")


class Recorder:
    """A fake pass that records calls and overlap, returning scripted outcomes."""

    def __init__(self, *outcomes, duration=0.0):
        self.calls, self.keys, self.running, self.max_running = [], [], 0, 0
        self.outcomes, self.duration = list(outcomes), duration

    async def __call__(self, key):
        self.keys.append(key)
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        self.calls.append(asyncio.get_running_loop().time())
        await asyncio.sleep(self.duration)
        self.running -= 1
        outcome = self.outcomes.pop(0) if self.outcomes else PassOutcome()
        if isinstance(outcome, Exception):
            raise outcome
        return outcome


def run(scenario):
    return asyncio.run(asyncio.wait_for(scenario(), timeout=20))


async def until(predicate, timeout=5.0):
    """Waits for ``predicate()``; generous because the test machine's CPUs are shared."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate() and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.01)


def test_many_pokes_within_the_coalescing_window_share_one_pass():
    async def scenario():
        recorder = Recorder()
        passes = JobPasses(recorder)
        for _ in range(8):
            passes.poke(KEY)
        await until(lambda: recorder.calls)
        await asyncio.sleep(COALESCE_SECONDS * 4)  # room for a wrongly queued second pass
        return recorder
    assert len(run(scenario).calls) == 1


def test_passes_of_one_job_never_overlap():
    async def scenario():
        recorder = Recorder(duration=0.05)
        passes = JobPasses(recorder)
        await asyncio.gather(*(passes.run_now(KEY) for _ in range(3)))
        return recorder
    recorder = run(scenario)
    assert len(recorder.calls) == 3 and recorder.max_running == 1


def test_a_requeue_runs_a_pass_later_and_an_earlier_one_wins():
    async def scenario():
        recorder = Recorder(PassOutcome(requeue=5.0))
        passes = JobPasses(recorder)
        started = asyncio.get_running_loop().time()
        await passes.run_now(KEY)  # asks for a pass in 5 s
        passes.schedule(KEY, 0.1)  # an earlier reason replaces it
        passes.schedule(KEY, 3.0)  # a later one does not
        await until(lambda: len(recorder.calls) == 2, timeout=2.5)
        return recorder, started
    recorder, started = run(scenario)
    assert len(recorder.calls) == 2
    assert 0.1 <= recorder.calls[1] - started < 2.5, "the pass ran at the 3 s or 5 s requeue, not the 0.1 s one"


def test_a_timer_that_already_fired_does_not_block_the_next_requeue():
    """A backoff timer that fired must not swallow a later TTL or deadline requeue."""
    async def scenario():
        recorder = Recorder()
        passes = JobPasses(recorder)
        passes.schedule(KEY, 0.05)
        await until(lambda: len(recorder.calls) == 1)
        passes.schedule(KEY, 0.05)
        await until(lambda: len(recorder.calls) == 2)
        return recorder
    assert len(run(scenario).calls) == 2


def test_a_failed_background_pass_is_retried():
    async def scenario():
        recorder = Recorder(RuntimeError("API down"))
        passes = JobPasses(recorder, errors=Backoff(base=0.1))
        passes.poke(KEY)
        await until(lambda: len(recorder.calls) == 2)
        return recorder
    assert len(run(scenario).calls) == 2


def test_failed_passes_of_a_job_back_off_exponentially_and_a_success_resets_the_delay():
    busy = kube.RetryableError("GET /api/v1/namespaces/ns/pods", 503, "ServiceUnavailable", "etcd leader changed")

    async def scenario():
        recorder = Recorder(busy, busy, busy, PassOutcome(), busy)
        passes = JobPasses(recorder, errors=Backoff(base=0.2))
        passes.poke(KEY)
        await until(lambda: len(recorder.calls) == 4, timeout=5)
        passes.poke(KEY)  # after the success: the next failure waits the base delay again
        await until(lambda: len(recorder.calls) == 6, timeout=5)
        return recorder
    calls = run(scenario).calls
    gaps = [later - earlier for earlier, later in zip(calls, calls[1:])]
    assert gaps[0] >= 0.2 and gaps[1] >= 0.4 and gaps[2] >= 0.8, gaps
    assert 0.2 <= gaps[4] < gaps[2] / 2, gaps


def test_events_during_a_failed_passs_delay_wait_for_it_and_other_jobs_do_not():
    async def scenario():
        recorder = Recorder(RuntimeError("API down"))
        passes = JobPasses(recorder, errors=Backoff(base=0.5))
        passes.poke(KEY)
        await until(lambda: len(recorder.calls) == 1)
        passes.poke(("ns", "other"))
        for _ in range(5):  # pod events of the failing job
            passes.poke(KEY)
            await asyncio.sleep(0.06)
        await until(lambda: len(recorder.calls) == 3, timeout=3)
        return recorder
    calls = run(scenario).calls
    assert calls[1] - calls[0] < 0.3, "another job's pass waited for this one's backoff"
    assert calls[2] - calls[0] >= 0.5, "a pod event ran the failing job's pass before its delay"


def test_the_handlers_retry_waits_longer_after_each_failure_and_as_long_as_retry_after_says():
    throttled = kube.RetryableError("POST /api/v1/namespaces/ns/pods", 429, "TooManyRequests", "slow down",
                                    retry_after=40)

    async def scenario():
        passes = JobPasses(Recorder(RuntimeError("a"), RuntimeError("b"), throttled))
        delays = []
        for _ in range(3):
            with pytest.raises(kopf.TemporaryError) as error:
                await passes.run_now(KEY)
            delays.append(error.value.delay)
        return delays
    assert run(scenario) == [2.0, 4.0, 40.0]


def test_a_deleted_job_is_forgotten_with_its_timer():
    async def scenario():
        recorder = Recorder(PassOutcome(requeue=0.2), PassOutcome(gone=True))
        passes = JobPasses(recorder)
        await passes.run_now(KEY)
        await passes.run_now(KEY)  # the job is gone: the 0.2 s requeue must not fire
        await asyncio.sleep(0.6)
        return recorder
    assert len(run(scenario).calls) == 2


@pytest.mark.parametrize("outcome, expected", [(PassOutcome(), None), (PassOutcome(invalid="spec.x (1) bad"), "bad")])
def test_the_job_handler_refuses_to_retry_an_invalid_spec(outcome, expected):
    cache = ClusterCache(api=None)

    class Memo:
        operator = OperatorState(PassContext(api=None, cache=cache), JobPasses(Recorder(outcome)))

    body = {"metadata": {"namespace": "ns", "name": "mlp", "resourceVersion": "7"}}

    async def scenario():
        await handlers.job_changed(body=body, namespace="ns", name="mlp", memo=Memo())
    if expected is None:
        run(scenario)
        assert cache.job("ns", "mlp") == body, "kopf's copy of the job reaches the cache"
    else:
        with pytest.raises(kopf.PermanentError, match=expected):
            run(scenario)


@pytest.mark.parametrize("old, new, patch", [
    ({"phase": "Running", "restarts": 1}, {"phase": "Failed"}, {"phase": "Failed", "restarts": None}),
    ({"lastSnapshot": {"epoch": 1, "path": "/s/1"}}, {"lastSnapshot": {"epoch": 2}},
     {"lastSnapshot": {"epoch": 2, "path": None}}),
    ({"conditions": [{"type": "A"}]}, {"conditions": []}, {"conditions": []}),
    ({"phase": "Running", "recovery": {"lostSeconds": 3.5}}, {"phase": "Failed", "recovery": {"lostSeconds": 3.5}},
     {"phase": "Failed"}),  # an unchanged value is not sent again
])
def test_the_status_patch_removes_what_the_new_status_dropped_at_any_depth(old, new, patch):
    assert apply.merge_patch(old, new) == patch


def test_passes_of_different_jobs_run_at_most_limit_at_once_and_all_run():
    async def scenario():
        recorder = Recorder(duration=0.05)
        passes = JobPasses(recorder, limit=2)
        for i in range(6):
            passes.poke(("ns", f"job-{i}"))
        await until(lambda: len(recorder.calls) == 6)
        return recorder
    recorder = run(scenario)
    assert (len(recorder.calls), recorder.max_running) == (6, 2)


def test_a_busy_job_poked_while_it_waits_for_a_slot_gets_one_pass_and_does_not_starve_another():
    busy, other = ("ns", "busy"), ("ns", "other")

    async def scenario():
        recorder = Recorder(duration=0.3)
        passes = JobPasses(recorder, limit=1)
        passes.poke(busy)
        await until(lambda: recorder.running)  # "busy" holds the only slot
        passes.poke(other)
        for _ in range(4):  # events of "busy" while its pass runs, then while it waits
            passes.poke(busy)
            await asyncio.sleep(COALESCE_SECONDS * 1.5)
        await until(lambda: len(recorder.calls) == 3, timeout=10)
        await asyncio.sleep(0.5)  # room for a wrongly queued fourth pass
        return recorder
    assert run(scenario).keys == [busy, other, busy]
