"""When each job's passes run: one at a time per job, at most ``limit`` at once, pod events
coalesced, planned requeues kept as timers, failed passes retried after a growing delay.

kopf cannot retry watch-event handlers, so a planned requeue (backoff end, deadline, TTL, the
progress poll) is an in-memory timer; a restarted operator re-plans every job from its
``@kopf.on.resume`` handler, so nothing is lost with it. A failed pass is retried after a delay
that doubles per failure in a row, per job (backoff.Backoff), whether kopf retries it or a
timer does.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable

import kopf

from ddpjob_operator.controller import kube
from ddpjob_operator.controller.backoff import Backoff

logger = logging.getLogger("ddpjob_operator")

COALESCE_SECONDS = 0.05  # pod events closer together than this share one pass

JobKey = tuple[str, str]  # (namespace, name)


@dataclasses.dataclass(frozen=True)
class PassOutcome:
    """What the wiring needs to know after a pass."""

    requeue: float | None = None  # look again after this many seconds even without an event
    invalid: str = ""  # why the spec is invalid ("" when valid): retrying will not help
    gone: bool = False  # the job was deleted: drop its timers and lock


class JobPasses:
    """Serialises, coalesces and schedules the passes of each job, at most ``limit`` at once.

    The limit is a first-come, first-served semaphore and a job waits in it at most once
    (pokes while it waits share its pass), so a busy job cannot starve the others and a
    burst of 1,000 new jobs runs ``limit`` passes at a time instead of 1,000.
    """

    def __init__(self, run: Callable[[JobKey], Awaitable[PassOutcome]], errors: Backoff | None = None,
                 limit: int = kube.DEFAULT_CONCURRENT_PASSES, acting: Callable[[], bool] = lambda: True):
        self._run = run
        # False while another replica acts (peering.PeeringView): pokes and timers are dropped,
        # and the view pokes every job when this replica takes over.
        self.acting = acting
        self.errors = errors or Backoff()  # failed passes in a row, per job
        self._slots = asyncio.Semaphore(limit)
        self._locks: dict[JobKey, asyncio.Lock] = {}
        self._queued: set[JobKey] = set()
        self._timers: dict[JobKey, asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Task] = set()

    async def run_now(self, key: JobKey, on_start: Callable[[], None] | None = None) -> PassOutcome:
        """One pass, awaited, so that kopf sees its errors; ``on_start`` is called when it has its
        turn (the job's lock and a slot).

        Raises:
            kopf.TemporaryError: the pass failed; its delay doubles with each failure in a row
                of this job (and honours a Retry-After), so kopf's retry backs off.
        """
        async with self._locks.setdefault(key, asyncio.Lock()), self._slots:
            if on_start is not None:
                on_start()
            try:
                outcome = await self._run(key)
            except Exception as e:
                delay = self.errors.failed(key, getattr(e, "retry_after", None))
                raise kopf.TemporaryError(f"{e} (failure {self.errors.failures(key)} in a row, retrying in "
                                          f"{delay:.0f}s)", delay=delay) from e
        self.errors.succeeded(key)
        if outcome.gone:
            self.forget(key)
        else:
            self.schedule(key, outcome.requeue)
        return outcome

    def poke(self, key: JobKey) -> None:
        """A pass soon; several pokes within COALESCE_SECONDS share it. None while another
        replica acts (``acting``)."""
        if key in self._queued or not self.acting():
            return
        self._queued.add(key)
        task = asyncio.get_running_loop().create_task(self._poked(key))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def schedule(self, key: JobKey, after: float | None) -> None:
        """A pass ``after`` seconds from now, unless an earlier one is already scheduled."""
        if after is None:
            return
        loop = asyncio.get_running_loop()
        current = self._timers.get(key)
        # A timer that already fired keeps its (past) deadline: only a pending one may win.
        pending = current is not None and not current.cancelled() and current.when() > loop.time()
        if pending and current.when() <= loop.time() + after:
            return
        if current is not None:
            current.cancel()
        self._timers[key] = loop.call_later(after, self.poke, key)

    def forget(self, key: JobKey) -> None:
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        self._locks.pop(key, None)

    async def _poked(self, key: JobKey) -> None:
        await asyncio.sleep(COALESCE_SECONDS)
        waiting = self.errors.remaining(key)
        if waiting > 0:  # the job's last pass failed: events meanwhile wait for its retry
            self._queued.discard(key)
            self.schedule(key, waiting)
            return
        try:
            # Pokes share this pass until it starts (waiting for a slot included); a poke
            # after that is an event the pass may have missed, and queues the next one.
            await self.run_now(key, on_start=lambda: self._queued.discard(key))
        except kopf.TemporaryError as e:  # nobody awaits a poked pass: log it and try again later
            logger.warning("Reconciling %s/%s failed: %s", *key, e)
            self.schedule(key, e.delay)
