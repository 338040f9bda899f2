"""Per-job retry delays after API errors: exponential, capped, reset by a success.

Two things back off per job, each on its own count:

* a pass that failed (the API answered 429 or 5xx, or not at all, while the pass read or
  wrote): its retry, and any pass an event would start meanwhile, wait (passes.JobPasses);
* the creates the API refused (403 quota, 422 invalid pod, 429, 5xx): the next passes still
  observe, write the status and delete, but create nothing until the delay has passed
  (``CreateRetries``; apply._create). The last refusal is kept for the next pass to report
  (decide/creation.py).

Both used to retry every 2 s forever, a request storm against a server already in trouble
or a quota that will not change by itself. Keys are jobs: a quota in one namespace never
delays a job in another.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Hashable

from ddpjob_operator.decide.creation import CreateFailure

BASE_SECONDS = 2.0  # the first retry waits as long as every retry used to
CAP_SECONDS = 300.0  # 2 s doubled 8 times (~5 min): a refusal that lasts costs one request per job per 5 min
_MAX_DOUBLINGS = 30  # keeps 2 ** n small; the cap is reached long before


def delay_after(failures: int, retry_after: float | None = None, *, base: float = BASE_SECONDS,
                cap: float = CAP_SECONDS) -> float:
    """Seconds to wait after ``failures`` failures in a row: base, 2 base, 4 base, ... up to
    ``cap``, and never less than the server's Retry-After (itself capped)."""
    delay = min(base * 2 ** min(max(failures - 1, 0), _MAX_DOUBLINGS), cap)
    if retry_after:
        delay = max(delay, min(retry_after, cap))
    return delay


@dataclasses.dataclass
class _State:
    failures: int = 0
    until: float = 0.0  # clock time the current delay ends


class Backoff:
    """Failures in a row per key and when each key may be tried again."""

    def __init__(self, base: float = BASE_SECONDS, cap: float = CAP_SECONDS,
                 clock: Callable[[], float] = time.monotonic):
        self.base, self.cap = base, cap
        self._clock = clock
        self._states: dict[Hashable, _State] = {}

    def failed(self, key: Hashable, retry_after: float | None = None) -> float:
        """Counts one more failure of ``key``; returns the delay before its next try."""
        state = self._states.setdefault(key, _State())
        state.failures += 1
        delay = delay_after(state.failures, retry_after, base=self.base, cap=self.cap)
        state.until = self._clock() + delay
        return delay

    def succeeded(self, key: Hashable) -> None:
        """``key`` worked: its next failure waits ``base`` again."""
        self._states.pop(key, None)

    def failures(self, key: Hashable) -> int:
        return self._states[key].failures if key in self._states else 0

    def remaining(self, key: Hashable) -> float:
        """Seconds until ``key`` may be tried again (0: now)."""
        state = self._states.get(key)
        return max(state.until - self._clock(), 0.0) if state else 0.0


class CreateRetries:
    """Per job: the last create the API refused, and the delay before creating again."""

    def __init__(self, backoff: Backoff | None = None):
        self._backoff = backoff or Backoff()
        self._last: dict[Hashable, CreateFailure] = {}

    def last(self, key: Hashable) -> CreateFailure | None:
        """The refusal the next pass reports (None: the last creates succeeded)."""
        return self._last.get(key)

    def hold(self, key: Hashable) -> float:
        """Seconds before the job's creates may be tried again (0: now)."""
        return self._backoff.remaining(key)

    def failed(self, key: Hashable, failure: CreateFailure, retry_after: float | None = None) -> float:
        """Records a refused create round; returns how long the job's creates now wait."""
        delay = self._backoff.failed(key, retry_after)
        self._last[key] = dataclasses.replace(failure, attempts=self._backoff.failures(key))
        return delay

    def succeeded(self, key: Hashable) -> None:
        """The job's creates went through (or none is needed any more): report and wait no longer."""
        self._backoff.succeeded(key)
        self._last.pop(key, None)

    def retry_now(self, key: Hashable) -> None:
        """The job changed (it may fix the refusal): its next pass creates at once; the
        refusal stays reported until a create succeeds."""
        self._backoff.succeeded(key)

    forget = succeeded  # the job is gone
