"""What a local node's exit means for the run: the operator's failure policy, applied to processes.

Pure: the decisions come from `ddpjob_operator.decide.failure` (classify, describe_exit) and
`ddpjob_operator.decide.budget` (the Ledger: open_incident, judge, limit_verdict, backoff_left),
exactly as the operator applies them to Pods, and the
messages are the operator's (constants.MSG_*), so a local run fails for the same
reasons, with the same words, as the job would on a cluster. Progress is the newest
complete snapshot, which a local run reads from the trainer's metrics (a Pod reports
it in its termination message).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Mapping

from ddpjob_operator.api import constants as C
from ddpjob_operator.decide.failure import Outcome, after_finish, classify, describe_exit, opens_incident, signal_name
from ddpjob_operator.decide.budget import Ledger, backoff_left, failure_message, judge, limit_verdict, open_incident
from ddpjob_operator.api.spec import FailurePolicy


# A replacement that joins while the surviving nodes re-form their group (dead-node
# detection, last call, worker start) makes them restart once more before any step:
# measured here under load, the first resumed step then came 26-37 s after the kill
# instead of 11-17 s. So a due replacement also waits for the survivors' first step
# after the failure, at most this long (then it starts anyway: they may need it).
HOLD_FOR_SURVIVORS_SECONDS = 60.0


def hold_replacements(*, now: float, failed_at: float | None, first_step: float | None,
                      last_step: float | None, running: int, min_replicas: int,
                      survivors_wait: bool = False) -> bool:
    """Whether replacements whose backoff is over should still wait (times on one clock).

    They wait while enough nodes survive to train without them (running >= minReplicas),
    the job has shown steps at all (first_step; a job without metrics never waits), none
    came since the failure (the survivors are still re-forming), and for at most
    HOLD_FOR_SURVIVORS_SECONDS after the failure. The backoff stays the minimum delay.
    Never where the survivors wait for the replacement themselves (survivors_wait:
    elasticPolicy.replacementWaitSeconds under ddpjob's rendezvous): their round is held open
    for it, and holding it back here would only make them wait longer.
    """
    if survivors_wait or first_step is None or failed_at is None or running < min_replicas:
        return False
    if last_step is not None and last_step > failed_at:
        return False
    return now - failed_at < HOLD_FOR_SURVIVORS_SECONDS


# The reason a `--node-lost` kill is judged with: the pod reason of a pod whose Node went away
# (decide/failure.py DISRUPTION_REASONS), so the decision and its words are the operator's.
LOST_REASON = "NodeLost"


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


class FailureBudget:
    """The run's failure incidents, charged as the operator charges them in the job status:
    the same Ledger and functions (decide/budget.py), kept in memory."""

    def __init__(self, policy: FailurePolicy):
        self.policy = policy
        self.ledger = Ledger()
        self.snapshot: Mapping[str, Any] | None = None  # the newest complete snapshot seen (status.lastSnapshot)

    @property
    def restarts(self) -> int:
        """Every failure incident so far (status.restarts)."""
        return self.ledger.budget.restarts

    @property
    def charged(self) -> int:
        """Incidents charged to failurePolicy.maxRestarts (those after a newer snapshot are free)."""
        return self.ledger.budget.charged

    def node_exited(self, index: int, code: int, *, started_at: datetime, failed_at: datetime,
                    finished: bool = False, snapshot: dict | None = None, lost: bool = False) -> Decision:
        """The decision for node `index` that exited with `code` (container convention).

        Args:
            started_at: when this incarnation of the node was started.
            failed_at: when it exited.
            finished: another node already exited 0: training is over, and no exit counts
                (decide/failure.py after_finish; the finished nodes decide the result).
            snapshot: the newest complete snapshot so far ({step, epoch, time}), None if none.
            lost: the node stands for a machine that went away (`--node-lost`): a disruption,
                as the operator judges a pod whose Node was lost (free, replaced at once).
        """
        outcome = classify(code, LOST_REASON if lost else None, permanent_exit_codes=self.policy.permanent_exit_codes)
        if outcome == Outcome.SUCCEEDED:
            return Decision(Action.FINISHED, f"node {index} finished (exit code 0)")
        what = describe_exit(f"node {index}", code, LOST_REASON if lost else signal_name(code))
        if after_finish(outcome, training_over=finished):
            return Decision(Action.NONE, C.MSG_EXITED_AFTER_FINISH.format(what=what), what=what)
        return self._failed(what, outcome, started_at, failed_at, snapshot)

    def store_exited(self, code: int, *, started_at: datetime, failed_at: datetime,
                     finished: bool = False, snapshot: dict | None = None) -> Decision:
        """The decision when the rendezvous store process exited: any exit loses the state."""
        outcome = classify(code, permanent_exit_codes=self.policy.permanent_exit_codes)
        if outcome == Outcome.SUCCEEDED:
            outcome = Outcome.RETRYABLE  # a store never finishes while nodes train
        what = describe_exit("the rendezvous store", code, signal_name(code))
        if after_finish(outcome, training_over=finished):
            return Decision(Action.NONE, C.MSG_EXITED_AFTER_FINISH.format(what=what), what=what)
        return self._failed(what, outcome, started_at, failed_at, snapshot)

    def _failed(self, what: str, outcome: Outcome, started_at: datetime, failed_at: datetime,
                snapshot: dict | None) -> Decision:
        if outcome == Outcome.PERMANENT:
            return Decision(Action.FAIL, C.MSG_PERMANENT_ERROR.format(what=what), what=what)
        self.snapshot = snapshot or self.snapshot
        if not opens_incident(outcome):  # the node went away, not the code: free, and replaced at once
            return Decision(Action.REPLACE, C.MSG_NODE_DISRUPTED.format(what=what),
                            self.replacement_delay(failed_at), what)
        opened, free = open_incident(self.ledger, failed_at, started_at), False
        if opened is not None:
            self.ledger = judge(opened, self.snapshot)
            free = self.ledger.budget.with_progress > opened.budget.with_progress
        limit = limit_verdict(self.ledger, self.policy, self.snapshot, what)
        if limit is not None:
            return Decision(Action.FAIL, limit[1], what=what)
        message = failure_message(what, self.ledger, self.policy, free, self.snapshot)
        return Decision(Action.REPLACE, message, self.replacement_delay(failed_at), what)

    def replacement_delay(self, now: datetime) -> float:
        """Seconds until a replacement may start: the backoff counted from the incident's start."""
        return backoff_left(self.ledger, self.policy, self.snapshot is not None, now)
