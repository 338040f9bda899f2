"""JobPasses: passes of one job never overlap, pod events are coalesced, requeues keep the
earliest time, a failed background pass is retried, a deleted job is forgotten."""
import asyncio

import kopf
import pytest

from ddpjob_operator.controller import handlers
from ddpjob_operator.controller.handlers import JobPasses, PassOutcome

KEY = ("ns", "mlp")


class Recorder:
    """A fake pass that records calls and overlap, returning scripted outcomes."""

    def __init__(self, *outcomes, duration=0.0):
        self.calls, self.running, self.max_running = [], 0, 0
        self.outcomes, self.duration = list(outcomes), duration

    async def __call__(self, key):
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
        await asyncio.sleep(handlers.COALESCE_SECONDS * 4)  # room for a wrongly queued second pass
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


def test_a_failed_background_pass_is_retried(monkeypatch):
    monkeypatch.setattr(handlers, "ERROR_RETRY_SECONDS", 0.1)

    async def scenario():
        recorder = Recorder(RuntimeError("API down"))
        passes = JobPasses(recorder)
        passes.poke(KEY)
        await until(lambda: len(recorder.calls) == 2)
        return recorder
    assert len(run(scenario).calls) == 2


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
    class Memo:
        passes = JobPasses(Recorder(outcome))

    async def scenario():
        await handlers.job_changed(namespace="ns", name="mlp", memo=Memo())
    if expected is None:
        run(scenario)
    else:
        with pytest.raises(kopf.PermanentError, match=expected):
            run(scenario)


@pytest.mark.parametrize("old, new, patch", [
    ({"phase": "Running", "restarts": 1}, {"phase": "Failed"}, {"phase": "Failed", "restarts": None}),
    ({"lastSnapshot": {"epoch": 1, "path": "/s/1"}}, {"lastSnapshot": {"epoch": 2}},
     {"lastSnapshot": {"epoch": 2, "path": None}}),
    ({"conditions": [{"type": "A"}]}, {"conditions": []}, {"conditions": []}),
])
def test_the_status_patch_removes_what_the_new_status_dropped_at_any_depth(old, new, patch):
    assert handlers.merge_patch(old, new) == patch
