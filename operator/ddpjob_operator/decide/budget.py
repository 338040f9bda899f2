"""The restart budget: what a failure incident costs, and how long a replacement waits.

One rule for both executors: the operator keeps the budget in the job's status
(`restarts`, `restartsWithProgress`, `restartsWithoutProgress`, `lastFailureTime`,
`recovery.accountedRestarts`, `recovery.snapshotAtLastFailure`) and `ddpjob run`
keeps it in memory; both charge incidents, check the limits and compute the backoff
with these functions. An incident after which a newer snapshot was complete is free
(progress-aware budgets, docs/recovery.md); a crash loop at one step is stopped by
`failurePolicy.maxRestartsWithoutProgress`.

The backoff slows crash loops, so it starts with the second incident of a streak: the job's
first incident, and the first after a newer snapshot, are replaced at once (as a Kubernetes Job
creates its second pod at once and backs off from the second failure, kubernetes#115022); each
further incident in a row without progress waits backoffSeconds, then twice that, up to
maxBackoffSeconds.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any, Mapping

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.clock import format_time, parse_time, seconds_between
from ddpjob_operator.api.spec import DDPJobSpec, FailurePolicy


# Failures that start within this many seconds of the current incident's first failure
# belong to that incident: when node 0 (the c10d store host) dies, the other agents exit
# within seconds, and that is one failure, not replicas-many.
INCIDENT_WINDOW_SECONDS = 60.0

# The two limits of the budget, by their failurePolicy field (named in verdicts and metrics).
MAX_RESTARTS = "maxRestarts"
MAX_WITHOUT_PROGRESS = "maxRestartsWithoutProgress"
BUDGETS = (MAX_RESTARTS, MAX_WITHOUT_PROGRESS)


def starts_new_incident(failed_at: datetime, started_at: datetime | None,
                        incident_start: datetime | None) -> bool:
    """Whether a failure opens a new incident (and so uses one restart of the budget).

    It joins the current incident only when the failed node already existed when the
    incident began (a cascade, e.g. agents losing node 0's store) and it failed within
    INCIDENT_WINDOW_SECONDS of it. A replacement that fails again is always new:
    otherwise a node crashing right after start would never use up the budget. A node created
    in the incident's own second counts as a replacement: a pod's creationTimestamp and a
    container's finishedAt have whole seconds, and the first incident is replaced at once, so its
    replacement is often created within the second of the failure (a cascade node created in
    that second is charged once too often, the safe side of the two).

    Args:
        failed_at: when the node's process exited.
        started_at: when the node (pod or local agent) was created; None if unknown.
        incident_start: when the current incident began; None if there was none.
    """
    if incident_start is None:
        return True
    if started_at is not None and started_at >= incident_start:
        return True
    return abs((failed_at - incident_start).total_seconds()) > INCIDENT_WINDOW_SECONDS


def snapshot_key(snapshot: Mapping[str, Any] | None) -> tuple[datetime, int] | None:
    """Orders snapshots: by completion time, then step (a wiped volume restarts at step 0,
    and the newest snapshot is what a resume uses, whatever its step)."""
    if not snapshot or snapshot.get("step") is None:
        return None
    moment = parse_time(snapshot.get("time")) or datetime.min.replace(tzinfo=timezone.utc)
    return moment, int(snapshot["step"])


def newer_snapshot(candidate: Mapping[str, Any] | None, current: Mapping[str, Any] | None) -> bool:
    """`candidate` was completed after `current` (any snapshot is newer than none)."""
    new, old = snapshot_key(candidate), snapshot_key(current)
    return new is not None and (old is None or new > old)


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
        return MAX_WITHOUT_PROGRESS
    if budget_exhausted(budget.charged, max_restarts):
        return MAX_RESTARTS
    return None


def backoff_exponent(budget: RestartBudget, progress_known: bool) -> int:
    """Which delay of backoff_seconds the current incident waits (0: none, 1: the first).

    A failure after progress is not a crash loop: it is replaced at once, and each further
    incident in a row without a newer snapshot waits the next delay (its place in the streak).
    Without progress reports the streak cannot be judged: the first charged incident is replaced
    at once and each later one waits the next delay."""
    if budget.restarts <= 0:
        return 0
    return budget.without_progress if progress_known else max(budget.charged - 1, 0)


@dataclass(frozen=True)
class Ledger:
    """Everything the budget remembers between failures; the operator keeps it in the job's
    status (`ledger_of` / `ledger_fields`), `ddpjob run` in memory.

    Attributes:
        budget: the incidents so far, split by progress.
        incident_start: when the current incident began (status.lastFailureTime).
        accounted: incidents already judged for progress (status.recovery.accountedRestarts).
        snapshot_at_last_failure: {step, time} of the newest snapshot when the last incident was
            judged (status.recovery.snapshotAtLastFailure); None until one was judged with progress known.
    """

    budget: RestartBudget = RestartBudget()
    incident_start: datetime | None = None
    accounted: int = 0
    snapshot_at_last_failure: Mapping[str, Any] | None = None


def open_incident(ledger: Ledger, failed_at: datetime, started_at: datetime | None) -> Ledger | None:
    """The ledger with one more incident when this failure opens one (starts_new_incident),
    None when it joins the current incident."""
    if not starts_new_incident(failed_at, started_at, ledger.incident_start):
        return None
    b = ledger.budget
    return replace(ledger, budget=RestartBudget(b.restarts + 1, b.with_progress, b.without_progress),
                   incident_start=failed_at)


def judge(ledger: Ledger, snapshot: Mapping[str, Any] | None) -> Ledger:
    """Judge the incidents not judged yet against the newest complete snapshot: the first one after
    a snapshot newer than at the previous incident is free (account_incidents)."""
    new = ledger.budget.restarts - ledger.accounted
    if new <= 0:
        return ledger
    progressed = None if not snapshot else newer_snapshot(snapshot, ledger.snapshot_at_last_failure)
    budget = account_incidents(ledger.budget, new, progressed)
    at_failure = ledger.snapshot_at_last_failure if progressed is None else \
        {"step": snapshot.get("step"), "time": snapshot.get("time")}
    return replace(ledger, budget=budget, accounted=budget.restarts, snapshot_at_last_failure=at_failure)


def limit_verdict(ledger: Ledger, policy: FailurePolicy, snapshot: Mapping[str, Any] | None,
                  what: str) -> tuple[str, str] | None:
    """(reason, message) when the budget passed a failurePolicy limit, None while it holds.

    Args:
        snapshot: the newest complete snapshot (named by NoProgress).
        what: the failure to name in NoProgress, e.g. "node pod mlp-node-1 (exit code 1)".
    """
    limit = budget_limit_passed(ledger.budget, policy.max_restarts, policy.max_restarts_without_progress)
    if limit is None:
        return None
    if limit == MAX_WITHOUT_PROGRESS:
        snapshot = snapshot or {}
        return C.REASON_NO_PROGRESS, C.MSG_NO_PROGRESS.format(
            count=ledger.budget.without_progress, step=snapshot.get("step"), epoch=snapshot.get("epoch"),
            max=policy.max_restarts_without_progress, what=what)
    message = C.MSG_RESTARTS_EXHAUSTED.format(restarts=ledger.budget.charged, max=policy.max_restarts)
    if ledger.budget.with_progress:
        message += C.MSG_PROGRESS_NOT_CHARGED.format(count=ledger.budget.with_progress)
    return C.REASON_RESTARTS_EXHAUSTED, message


def failure_message(what: str, ledger: Ledger, policy: FailurePolicy, free: bool,
                    snapshot: Mapping[str, Any] | None) -> str:
    """The NodeFailed message: what failed, the budget used, and why it was free when it was."""
    message = C.MSG_NODE_FAILED.format(what=what, restarts=ledger.budget.charged, max=policy.max_restarts)
    if free:
        message += f"; not charged: a newer snapshot (step {(snapshot or {}).get('step')}) was complete"
    return message


def backoff_left(ledger: Ledger, policy: FailurePolicy, progress_known: bool, now: datetime) -> float:
    """Seconds until replacements may start (0: now): the backoff counted from the incident's
    start. A failure after progress is replaced at once; a crash loop waits, doubling."""
    nth = backoff_exponent(ledger.budget, progress_known)
    if nth == 0 or ledger.incident_start is None:
        return 0.0
    wait = backoff_seconds(nth, policy.backoff_seconds, policy.max_backoff_seconds)
    return max(0.0, wait - seconds_between(ledger.incident_start, now))


# --- The ledger in a job's status --------------------------------------------------------

def ledger_of(status: Mapping[str, Any]) -> Ledger:
    """The ledger the status holds."""
    recovery = status.get("recovery") or {}
    budget = RestartBudget(int(status.get("restarts") or 0), int(status.get("restartsWithProgress") or 0),
                           int(status.get("restartsWithoutProgress") or 0))
    return Ledger(budget, parse_time(status.get("lastFailureTime")), int(recovery.get("accountedRestarts") or 0),
                  recovery.get("snapshotAtLastFailure"))


def ledger_fields(ledger: Ledger, status: Mapping[str, Any]) -> dict[str, Any]:
    """The status fields that hold `ledger`, to merge over `status` (recovery merged, not replaced).
    The progress split is written only once an incident was judged with progress known."""
    recovery = dict(status.get("recovery") or {})
    if ledger.accounted or "accountedRestarts" in recovery:
        recovery["accountedRestarts"] = ledger.accounted
    fields: dict[str, Any] = {"restarts": ledger.budget.restarts, "recovery": recovery,
                              "lastFailureTime": format_time(ledger.incident_start) if ledger.incident_start else None}
    if ledger.snapshot_at_last_failure is not None:
        recovery["snapshotAtLastFailure"] = ledger.snapshot_at_last_failure
        fields.update(restartsWithProgress=ledger.budget.with_progress,
                      restartsWithoutProgress=ledger.budget.without_progress)
    return fields


def budget_use(status: Mapping[str, Any], policy: FailurePolicy) -> dict[str, tuple[int, int]]:
    """How much of each failurePolicy restart limit the job has used, as (used, limit) by field name.

    maxRestarts counts the charged incidents (those after which no newer snapshot was complete);
    maxRestartsWithoutProgress the current streak of such incidents, and appears only when the
    policy sets it. One more incident than a limit fails the job (budget_limit_passed), so
    used == limit means the next charged incident is the last straw.
    """
    budget = ledger_of(status).budget
    use = {MAX_RESTARTS: (budget.charged, policy.max_restarts)}
    if policy.max_restarts_without_progress is not None:
        use[MAX_WITHOUT_PROGRESS] = (budget.without_progress, policy.max_restarts_without_progress)
    return use


def replacement_delay(spec: DDPJobSpec, status: Mapping[str, Any], now: datetime) -> float:
    """backoff_left for a job: seconds until its replacements may be created."""
    return backoff_left(ledger_of(status), spec.failure_policy, bool(status.get("lastSnapshot")), now)
