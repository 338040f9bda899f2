"""The restart budget: what a failure incident costs, and how long a replacement waits.

One rule for both executors: the operator keeps the budget in the job's status
(`restarts`, `restartsWithProgress`, `restartsWithoutProgress`, `lastFailureTime`,
`recovery.accountedRestarts`, `recovery.snapshotAtLastFailure`) and `ddpjob run`
keeps it in memory; both charge incidents, check the limits and compute the backoff
with these functions. An incident after which a newer snapshot was complete is free
(progress-aware budgets, docs/recovery.md); a crash loop at one step is stopped by
`failurePolicy.maxRestartsWithoutProgress`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Mapping

from ddpjob_operator.api.clock import parse_time, seconds_between
from ddpjob_operator.api.spec import DDPJobSpec
from ddpjob_operator.decide.failure import newer_snapshot


def backoff_seconds(restarts: int, base: float, maximum: float) -> float:
    """Delay before replacement number `restarts` (1-based): base, 2*base, 4*base ... <= maximum."""
    if restarts <= 0:
        return 0.0
    return float(min(base * 2 ** min(restarts - 1, 32), maximum))


def budget_exhausted(restarts: int, max_restarts: int) -> bool:
    """True when `restarts` incidents are more than the policy recovers from."""
    return restarts > max_restarts


@dataclass(frozen=True)
class RestartBudget:
    """Failure incidents, split by whether training had saved a newer snapshot before each.

    Attributes:
        restarts: every failure incident (status.restarts).
        with_progress: incidents after which a snapshot newer than at the previous incident
            existed; they are not charged to failurePolicy.maxRestarts.
        without_progress: incidents in a row with no newer snapshot (0 after one with progress);
            compared with failurePolicy.maxRestartsWithoutProgress.
    """

    restarts: int = 0
    with_progress: int = 0
    without_progress: int = 0

    @property
    def charged(self) -> int:
        """Incidents that count against failurePolicy.maxRestarts."""
        return self.restarts - self.with_progress


def account_incidents(budget: RestartBudget, new_incidents: int, progressed: bool | None) -> RestartBudget:
    """The budget after `new_incidents` more incidents (already counted in budget.restarts).

    Args:
        budget: the budget with `restarts` already raised by the new incidents.
        new_incidents: incidents not accounted yet (usually 1).
        progressed: a newer snapshot exists than at the previous incident; None when no
            progress was ever reported (then every incident is charged and the streak, which
            cannot be judged, stays as it is).
    """
    if new_incidents <= 0:
        return budget
    if progressed is None:
        return budget
    if progressed:  # the first incident after progress is free; any others in the same pass are not
        return RestartBudget(budget.restarts, budget.with_progress + 1, new_incidents - 1)
    return RestartBudget(budget.restarts, budget.with_progress, budget.without_progress + new_incidents)


def budget_limit_passed(budget: RestartBudget, max_restarts: int, max_without_progress: int | None) -> str | None:
    """The failurePolicy field whose limit the budget passed ("maxRestarts",
    "maxRestartsWithoutProgress"), None while both hold. The streak is checked first:
    it is the more specific explanation of a crash loop."""
    if max_without_progress is not None and budget.without_progress > max_without_progress:
        return "maxRestartsWithoutProgress"
    if budget_exhausted(budget.charged, max_restarts):
        return "maxRestarts"
    return None


def backoff_exponent(budget: RestartBudget, progress_known: bool) -> int:
    """Which replacement the backoff treats this as (1-based): a failure after progress starts
    over at the first delay, a crash loop doubles it; without progress reports every charged
    incident doubles it."""
    if budget.restarts <= 0:
        return 0
    return budget.without_progress + 1 if progress_known else max(budget.charged, 1)


def budget_of(status: Mapping[str, Any]) -> RestartBudget:
    return RestartBudget(int(status.get("restarts") or 0), int(status.get("restartsWithProgress") or 0),
                         int(status.get("restartsWithoutProgress") or 0))


def account(status: dict[str, Any]) -> RestartBudget:
    """Judge the incidents counted in status.restarts since the last call: each is free when a
    snapshot newer than at the previous incident was complete (failure.account_incidents)."""
    recovery = dict(status.get("recovery") or {})
    budget = budget_of(status)
    new = budget.restarts - int(recovery.get("accountedRestarts") or 0)
    if new <= 0:
        return budget
    snapshot = status.get("lastSnapshot")
    progressed = None if not snapshot else newer_snapshot(snapshot, recovery.get("snapshotAtLastFailure"))
    budget = account_incidents(budget, new, progressed)
    recovery["accountedRestarts"] = budget.restarts
    if progressed is not None:  # no report yet: nothing to judge, the fields stay unset
        status["restartsWithProgress"] = budget.with_progress
        status["restartsWithoutProgress"] = budget.without_progress
        recovery["snapshotAtLastFailure"] = {"step": snapshot.get("step"), "time": snapshot.get("time")}
    status["recovery"] = recovery
    return budget


def replacement_delay(spec: DDPJobSpec, status: Mapping[str, Any], now: datetime) -> float:
    """Seconds until replacements may be created (0 when they may be created now)."""
    since = parse_time(status.get("lastFailureTime"))
    nth = backoff_exponent(budget_of(status), bool(status.get("lastSnapshot")))
    if nth == 0 or since is None:
        return 0.0
    fp = spec.failure_policy
    wait = backoff_seconds(nth, fp.backoff_seconds, fp.max_backoff_seconds)
    return max(0.0, wait - seconds_between(since, now))
