"""Failure policy: what a finished node means, and when to try again.

Pure and fed with plain values (exit code, reason, flags, counts) so that the
operator (from Pod status) and `ddpjob run` (from local processes) decide alike.
"""

from __future__ import annotations

import enum
import signal
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterable, Mapping

from ddpjob_rdzv import BACKEND_NAME, C10D_BACKEND_NAME

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.clock import format_time
from ddpjob_operator.decide.observed import PodView


DISRUPTION_REASONS = ("Evicted", "Preempting", "Preempted", "Shutdown", "NodeShutdown", "Terminated",
                      "DeletionByTaintManager", "NodeLost")  # the node went away, not the code


class Outcome(str, enum.Enum):
    """What a finished node means for the job."""

    SUCCEEDED = "succeeded"  # torchrun exited 0: training finished
    PERMANENT = "permanent"  # retrying cannot help (exit code listed as permanent)
    RETRYABLE = "retryable"  # replace the node; costs one restart of the budget
    DISRUPTION = "disruption"  # eviction/preemption; replace without using the budget


def classify(exit_code: int | None, reason: str | None = None, *, disrupted: bool = False,
             permanent_exit_codes: Iterable[int] = ()) -> Outcome:
    """Classify a finished node.

    Args:
        exit_code: exit status of torchrun (None when it never ran or is unknown).
        reason: Pod status reason ("Evicted") or container termination reason ("OOMKilled").
        disrupted: the Pod has a DisruptionTarget condition (preemption, node drain, taint).
        permanent_exit_codes: failurePolicy.permanentExitCodes.
    """
    if exit_code == 0:
        return Outcome.SUCCEEDED
    if disrupted or reason in DISRUPTION_REASONS:
        return Outcome.DISRUPTION
    if exit_code is not None and exit_code in set(permanent_exit_codes):
        return Outcome.PERMANENT
    return Outcome.RETRYABLE  # OOMKilled included: a spike may not repeat, the budget bounds it


def opens_incident(outcome: Outcome) -> bool:
    """Whether a failed node opens (or joins) a failure incident: judged against the restart
    budget, and replaced only after the backoff. A disruption (the node went away: evicted,
    preempted, its Node lost) does not: it costs no budget and its replacement starts at once,
    bar the backoff of an incident still running, with or without warm spares. One rule for the
    operator (status.py) and `ddpjob run` (local/policy.py, a kill given as --node-lost)."""
    return outcome == Outcome.RETRYABLE


def after_finish(outcome: Outcome | None, *, training_over: bool) -> bool:
    """Whether a failed node changes nothing because training already finished.

    A node exits 0 only when torchrun saw all of its group's workers finish every step, and
    torchrun then closes the rendezvous: a node still outside the group (a replacement that
    reached the rendezvous late, which torch's agent ends with RendezvousClosedError, exit 1)
    or one that fails on its way out cannot add or undo training. The nodes that finished
    decide the job's result, so such an exit is neither charged nor permanent, and nothing
    replaces it. One rule for the operator (status.py, training_over: a node pod of the
    current group had exited 0 when this one failed, NodeGroups.finished_by) and `ddpjob run`
    (local/policy.py: a node exited 0 before this exit was reaped).
    """
    return training_over and outcome not in (None, Outcome.SUCCEEDED)


def describe_exit(who: str, exit_code: int | None, reason: str | None = None) -> str:
    """'node pod mlp-node-1 failed (exit code 137, OOMKilled)': the one wording of a failed node,
    store or pod, used by the operator (reason from the pod) and `ddpjob run` (the signal)."""
    parts = [f"exit code {exit_code}" if exit_code is not None else "no exit code"] + ([reason] if reason else [])
    return f"{who} failed ({', '.join(parts)})"


def signal_name(exit_code: int | None) -> str | None:
    """'SIGKILL' for 137 (128 + N, as container runtimes report a death by signal N); else None."""
    if exit_code is None or exit_code <= 128:
        return None
    try:
        return signal.Signals(exit_code - 128).name
    except ValueError:
        return None


# What torchrun and Python print (the pod's log tail) when a node uses ddpjob-trainer and the image
# lacks it: a rendezvous backend its entry points register (fastRestart's ddpjob-c10d, etcd-v3),
# or one of its modules (the fork server, the example trainer). The default c10d job of a plain
# script needs none of it.
TRAINER_MISSING_MARKS = (f"rendezvous backend '{C10D_BACKEND_NAME}' is not registered",
                         f"rendezvous backend '{BACKEND_NAME}' is not registered",
                         "No module named 'ddpjob_trainer'")


def trainer_missing(pod: PodView) -> str | None:
    """The mark (TRAINER_MISSING_MARKS) in a failed pod's log tail, None without one: the image lacks
    ddpjob-trainer, which every replacement would lack too."""
    tail = "" if pod.termination_holds_record else pod.termination_message
    return next((mark for mark in TRAINER_MISSING_MARKS if mark in tail), None)


def classify_pod(pod: PodView, permanent_exit_codes: Iterable[int] = ()) -> Outcome | None:
    """Outcome of a finished Pod; None while it is still pending or running. A trainer whose
    record carries ``fatal`` (it raised DoNotRetry) said retrying cannot help: permanent; so does
    a node that used ddpjob-trainer where the image lacks it (trainer_missing)."""
    if pod.phase == "Succeeded":
        return Outcome.SUCCEEDED
    if pod.phase != "Failed":
        return None
    if pod.fatal is not None or trainer_missing(pod) is not None:
        return Outcome.PERMANENT
    return classify(pod.exit_code, pod.reason, disrupted=pod.disruption is not None,
                    permanent_exit_codes=permanent_exit_codes)


# --- Diagnosis: what a failure was, for status.failures, Events and metrics ------------

# DisruptionTarget reasons of a pod lost with its node (the others are preemptions/evictions).
NODE_LOST_REASONS = ("NodeLost", "DeletionByPodGC", "DeletionByTaintManager", "NodeShutdown", "Shutdown",
                     "Terminated")
IMAGE_PULL_REASONS = ("ErrImagePull", "ImagePullBackOff")  # may clear up (registry outage): bounded wait
INVALID_IMAGE_REASONS = ("InvalidImageName",)  # can never clear up: fail at once
MESSAGE_CHARS = 300  # a failure message kept in status; the full one is in the pod


@dataclass(frozen=True)
class Diagnosis:
    """A failed node pod, explained."""

    outcome: Outcome
    cause: str  # C.CAUSE_*
    exit_code: int | None
    reason: str  # the most specific reason the API gave (DisruptionTarget's, the pod's, the container's)
    message: str


def diagnose_pod(pod: PodView, permanent_exit_codes: Iterable[int] = (), *,
                 include_log_tail: bool = False) -> Diagnosis | None:
    """Why a Failed pod failed; None when it has not failed (pending, running, succeeded).
    ``include_log_tail``: failurePolicy.includeLogTail (see _failure_message)."""
    outcome = classify_pod(pod, permanent_exit_codes)
    if outcome in (None, Outcome.SUCCEEDED):
        return None
    if pod.fatal is not None:
        return Diagnosis(outcome, C.CAUSE_DO_NOT_RETRY, pod.exit_code, pod.fatal["reason"], pod.fatal["message"])
    if (mark := trainer_missing(pod)) is not None:  # our own words, safe to show without includeLogTail
        return Diagnosis(outcome, C.CAUSE_TRAINER_NOT_IN_IMAGE, pod.exit_code, C.CAUSE_TRAINER_NOT_IN_IMAGE, mark)
    if pod.preflight_failure is not None:  # the trainer never started: the node failed the check
        # Its message is the init container's log tail (FallbackToLogsOnError): the image's own code
        # runs before the check and may print anything, so the tail follows includeLogTail too.
        shown = pod.preflight_failure if include_log_tail else C.MSG_PREFLIGHT_TAIL_HIDDEN
        return Diagnosis(outcome, C.CAUSE_PREFLIGHT, pod.exit_code, C.CAUSE_PREFLIGHT, _shortened(shown))
    disruption = pod.disruption
    reason = (disruption or {}).get("reason") or pod.reason or ""
    if outcome == Outcome.DISRUPTION:
        cause = C.CAUSE_NODE_LOST if reason in NODE_LOST_REASONS else C.CAUSE_DISRUPTED
    elif outcome == Outcome.PERMANENT:
        cause = C.CAUSE_PERMANENT
    else:
        cause = C.CAUSE_OOM if pod.reason == "OOMKilled" else C.CAUSE_ERROR
    return Diagnosis(outcome, cause, pod.exit_code, reason, _failure_message(pod, disruption, include_log_tail))


def diagnose_deleted(pod: PodView, *, include_log_tail: bool = False) -> Diagnosis | None:
    """A pod being deleted under a DisruptionTarget condition (drained, preempted, node gone)
    before it finished: a disruption worth reporting, though no failure is counted."""
    disruption = pod.disruption
    if disruption is None or not pod.deleting:
        return None
    reason = disruption.get("reason") or ""
    cause = C.CAUSE_NODE_LOST if reason in NODE_LOST_REASONS else C.CAUSE_DISRUPTED
    return Diagnosis(Outcome.DISRUPTION, cause, pod.exit_code, reason,
                     _failure_message(pod, disruption, include_log_tail))


def diagnose_deleted_by_someone(pod: PodView) -> Diagnosis:
    """A node pod deleted while it trained, with no DisruptionTarget (status.py tells it from
    the operator's own deletions): free, like a disruption."""
    return Diagnosis(Outcome.DISRUPTION, C.CAUSE_DELETED, pod.exit_code, C.CAUSE_DELETED,
                     "deleted while it ran; not by the operator and without a DisruptionTarget condition")


def _failure_message(pod: PodView, disruption: Mapping[str, Any] | None, include_log_tail: bool = False) -> str:
    """DisruptionTarget's message, else the trainer's error from its progress record, else the
    kubelet's termination message (a log tail under FallbackToLogsOnError), else the pod's.

    A log tail is copied only with ``include_log_tail``: it may hold anything the trainer
    printed, and status and Events are read by people who may lack the pods/log grant.
    """
    record = pod.record
    # A message that holds a record (even one refused) is not a log tail: never show it raw.
    tail = "" if pod.termination_holds_record else pod.termination_message
    if tail and not include_log_tail:
        tail = C.MSG_LOG_TAIL_HIDDEN
    text = ((disruption or {}).get("message") or record.get("error")
            or tail or pod.status_message or "")
    return _shortened(text)


def _shortened(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= MESSAGE_CHARS else "..." + text[-(MESSAGE_CHARS - 3):]  # a log tail ends well


def diagnose_image_pull(pod: PodView, now: datetime, timeout_seconds: float) -> Diagnosis | None:
    """A pod whose image cannot be pulled (see image_pull_stuck): permanent, cause ImagePull."""
    if not image_pull_stuck(pod, now, timeout_seconds):
        return None
    waiting = pod.waiting
    return Diagnosis(Outcome.PERMANENT, C.CAUSE_IMAGE_PULL, None, waiting.get("reason") or "",
                     waiting.get("message") or "")


def image_pull_stuck(pod: PodView, now: datetime, timeout_seconds: float) -> bool:
    """The trainer image cannot be pulled: a name that can never work, or pull errors for
    longer than `timeout_seconds` after the pod was created (a registry outage may pass)."""
    reason = pod.waiting.get("reason")
    if reason in INVALID_IMAGE_REASONS:
        return True
    if reason not in IMAGE_PULL_REASONS:
        return False
    return pod.created_at is not None and (now - pod.created_at).total_seconds() >= timeout_seconds


def permanent_failure(pod: PodView, what: str) -> tuple[str, str]:
    """Reason and message of the job's failure when ``pod`` failed for good: the trainer's own
    (DoNotRetry) when its record says so, ddpjob-trainer missing from the image, else a permanent exit code."""
    if pod.fatal is not None:
        return pod.fatal["reason"], C.MSG_DO_NOT_RETRY.format(what=what, reason=pod.fatal["reason"])
    if trainer_missing(pod) is not None:  # `what` holds the mark (diagnose_pod)
        return C.REASON_TRAINER_NOT_IN_IMAGE, C.MSG_TRAINER_NOT_IN_IMAGE.format(what=what)
    return C.REASON_PERMANENT_ERROR, C.MSG_PERMANENT_ERROR.format(what=what)


def image_pull_check_in(pods: Iterable[PodView], now: datetime, timeout_seconds: float) -> float | None:
    """Seconds until a pod now failing to pull its image passes the timeout (None: none is),
    so the job fails on time even if the kubelet reports nothing new meanwhile."""
    waits = []
    for pod in pods:
        if pod.waiting.get("reason") in IMAGE_PULL_REASONS and pod.created_at is not None:
            waits.append(max(timeout_seconds - (now - pod.created_at).total_seconds(), 0.0))
    return min(waits) if waits else None


def failure_entry(pod: PodView | None, cause: str, reason: str | None, message: str | None, when: datetime,
                  **details: Any) -> dict[str, Any]:
    """One status.failures entry, whoever found the failure (a failed pod, a hang, a straggler):
    the pod (index, name, uid, and its node, which avoided_nodes.py keeps bad ones out by),
    the cause, the reason and message, when, and the cause's own ``details`` (exitCode, step,
    stalledNodes); empty values are left out."""
    entry = {"index": pod.index if pod else None, "pod": pod.name if pod else None,
             "podUID": pod.uid if pod else None, "node": (pod.node_name or None) if pod else None,
             "cause": cause, **details, "reason": reason or None, "message": message or None,
             "time": format_time(when)}
    return {k: v for k, v in entry.items() if v is not None}
