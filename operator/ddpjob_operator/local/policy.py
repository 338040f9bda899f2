"""What a local node's exit means for the run: the operator's failure policy, applied to processes.

Pure: the decisions come from `ddpjob_operator.decide.failure` (classify, starts_new_incident,
the progress-aware RestartBudget with account_incidents / budget_limit_passed /
backoff_exponent, backoff_seconds) exactly as status.py applies them to Pods, and the
messages are the operator's (constants.MSG_*), so a local run fails for the same
reasons, with the same words, as the job would on a cluster. Progress is the newest
complete snapshot, which a local run reads from the trainer's metrics (a Pod reports
it in its termination message).
"""

from __future__ import annotations

import enum
import signal
from dataclasses import dataclass
from datetime import datetime

from ddpjob_operator.api import constants as C
from ddpjob_operator.decide.failure import Outcome, classify, newer_snapshot, starts_new_incident
from ddpjob_operator.decide.budget import (
    RestartBudget,
    account_incidents,
    backoff_exponent,
    backoff_seconds,
    budget_limit_passed,
)
from ddpjob_operator.api.spec import FailurePolicy


# A replacement that joins while the surviving nodes re-form their group (dead-node
# detection, last call, worker start) makes them restart once more before any step:
# measured here under load, the first resumed step then came 26-37 s after the kill
# instead of 11-17 s. So a due replacement also waits for the survivors' first step
# after the failure, at most this long (then it starts anyway: they may need it).
HOLD_FOR_SURVIVORS_SECONDS = 60.0


def hold_replacements(*, now: float, failed_at: float | None, first_step: float | None,
                      last_step: float | None, running: int, min_replicas: int) -> bool:
    """Whether replacements whose backoff is over should still wait (times on one clock).

    They wait while enough nodes survive to train without them (running >= minReplicas),
    the job has shown steps at all (first_step; a job without metrics never waits), none
    came since the failure (the survivors are still re-forming), and for at most
    HOLD_FOR_SURVIVORS_SECONDS after the failure. The backoff stays the minimum delay.
    """
    if first_step is None or failed_at is None or running < min_replicas:
        return False
    if last_step is not None and last_step > failed_at:
        return False
    return now - failed_at < HOLD_FOR_SURVIVORS_SECONDS


class Action(str, enum.Enum):
    """What the runner does about one node's exit."""

    FINISHED = "finished"  # the node exited 0: training is done
    REPLACE = "replace"  # start the node again after `delay` seconds
    FAIL = "fail"  # stop every node; the run failed
    NONE = "none"  # nothing (a failure after training finished: nobody needs the node)


@dataclass(frozen=True)
class Decision:
    """The action, its delay (REPLACE) and a message in the operator's words."""

    action: Action
    message: str
    delay: float = 0.0
    what: str = ""  # what failed, e.g. "node 1 failed (exit code 137, SIGKILL)"


def container_exit_code(returncode: int) -> int:
    """Popen's returncode as a container runtime reports it: 128 + N for death by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def describe_exit(who: str, code: int) -> str:
    """'node 1 failed (exit code 137, SIGKILL)', the local twin of status._describe."""
    detail = f"exit code {code}"
    if code > 128:
        try:
            detail += f", {signal.Signals(code - 128).name}"
        except ValueError:
            pass
    return f"{who} failed ({detail})"


class FailureBudget:
    """The run's failure incidents, counted and charged as the operator does in the job status."""

    def __init__(self, policy: FailurePolicy):
        self.policy = policy
        self.budget = RestartBudget()  # restarts, with_progress, without_progress
        self.incident_start: datetime | None = None  # status.lastFailureTime
        self.snapshot_at_last_failure: dict | None = None  # status.recovery.snapshotAtLastFailure
        self.progress_known = False  # a snapshot was ever reported (status.lastSnapshot is set)

    @property
    def restarts(self) -> int:
        """Every failure incident so far (status.restarts)."""
        return self.budget.restarts

    @property
    def charged(self) -> int:
        """Incidents charged to failurePolicy.maxRestarts (those after a newer snapshot are free)."""
        return self.budget.charged

    def node_exited(self, index: int, code: int, *, started_at: datetime, failed_at: datetime,
                    finished: bool = False, snapshot: dict | None = None) -> Decision:
        """The decision for node `index` that exited with `code` (container convention).

        Args:
            started_at: when this incarnation of the node was started.
            failed_at: when it exited.
            finished: another node already exited 0 (training is over; nothing is replaced).
            snapshot: the newest complete snapshot so far ({step, epoch, time}), None if none.
        """
        outcome = classify(code, permanent_exit_codes=self.policy.permanent_exit_codes)
        if outcome == Outcome.SUCCEEDED:
            return Decision(Action.FINISHED, f"node {index} finished (exit code 0)")
        return self._failed(describe_exit(f"node {index}", code), outcome, started_at, failed_at, finished, snapshot)

    def store_exited(self, code: int, *, started_at: datetime, failed_at: datetime,
                     finished: bool = False, snapshot: dict | None = None) -> Decision:
        """The decision when the rendezvous store process exited: any exit loses the state."""
        outcome = classify(code, permanent_exit_codes=self.policy.permanent_exit_codes)
        if outcome == Outcome.SUCCEEDED:
            outcome = Outcome.RETRYABLE  # a store never finishes while nodes train
        return self._failed(describe_exit("the rendezvous store", code), outcome, started_at, failed_at,
                            finished, snapshot)

    def _failed(self, what: str, outcome: Outcome, started_at: datetime, failed_at: datetime,
                finished: bool, snapshot: dict | None) -> Decision:
        if outcome == Outcome.PERMANENT:
            return Decision(Action.FAIL, C.MSG_PERMANENT_ERROR.format(what=what), what=what)
        if finished:
            return Decision(Action.NONE, f"{what} after training finished; not replaced", what=what)
        free = False
        if starts_new_incident(failed_at, started_at, self.incident_start):
            self.incident_start = failed_at
            free = self._account(snapshot)
        limit = budget_limit_passed(self.budget, self.policy.max_restarts, self.policy.max_restarts_without_progress)
        if limit is not None:
            return Decision(Action.FAIL, self._limit_message(limit, what, snapshot), what=what)
        message = C.MSG_NODE_FAILED.format(what=what, restarts=self.charged, max=self.policy.max_restarts)
        if free:
            message += f"; not charged: a newer snapshot (step {snapshot.get('step')}) was complete"
        return Decision(Action.REPLACE, message, self.replacement_delay(failed_at), what)

    def _account(self, snapshot: dict | None) -> bool:
        """One more incident (progress.account's rule); True when it is free."""
        progressed = None if not snapshot else newer_snapshot(snapshot, self.snapshot_at_last_failure)
        before = self.budget.with_progress
        raised = RestartBudget(self.budget.restarts + 1, self.budget.with_progress, self.budget.without_progress)
        self.budget = account_incidents(raised, 1, progressed)
        if progressed is not None:
            self.progress_known = True
            self.snapshot_at_last_failure = {"step": snapshot.get("step"), "time": snapshot.get("time")}
        return self.budget.with_progress > before

    def _limit_message(self, limit: str, what: str, snapshot: dict | None) -> str:
        fp = self.policy
        if limit == "maxRestartsWithoutProgress":
            snapshot = snapshot or {}
            return C.MSG_NO_PROGRESS.format(count=self.budget.without_progress, step=snapshot.get("step"),
                                            epoch=snapshot.get("epoch"), max=fp.max_restarts_without_progress,
                                            what=what)
        message = C.MSG_RESTARTS_EXHAUSTED.format(restarts=self.charged, max=fp.max_restarts)
        if self.budget.with_progress:
            message += C.MSG_PROGRESS_NOT_CHARGED.format(count=self.budget.with_progress)
        return message

    def replacement_delay(self, now: datetime) -> float:
        """Seconds until a replacement may start: the backoff counted from the incident's start.

        A failure after progress starts over at the first delay; a crash loop doubles it."""
        nth = backoff_exponent(self.budget, self.progress_known)
        if nth == 0 or self.incident_start is None:
            return 0.0
        wait = backoff_seconds(nth, self.policy.backoff_seconds, self.policy.max_backoff_seconds)
        return max(0.0, wait - (now - self.incident_start).total_seconds())
