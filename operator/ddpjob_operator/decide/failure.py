"""Failure policy: what a finished node means, and when to try again.

Pure and fed with plain values (exit code, reason, flags, counts) so that the
operator (from Pod status) and `ddpjob run` (from local processes) decide alike.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Iterable, Mapping

from ddpjob_rdzv import progress_record

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.clock import parse_time

# Failures that start within this many seconds of the current incident's first failure
# belong to that incident: when node 0 (the c10d store host) dies, the other agents exit
# within seconds, and that is one failure, not replicas-many.
INCIDENT_WINDOW_SECONDS = 60.0

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


def starts_new_incident(failed_at: datetime, started_at: datetime | None,
                        incident_start: datetime | None) -> bool:
    """Whether a failure opens a new incident (and so uses one restart of the budget).

    It joins the current incident only when the failed node already existed when the
    incident began (a cascade, e.g. agents losing node 0's store) and it failed within
    INCIDENT_WINDOW_SECONDS of it. A replacement that fails again is always new:
    otherwise a node crashing right after start would never use up the budget.

    Args:
        failed_at: when the node's process exited.
        started_at: when the node (pod or local agent) was created; None if unknown.
        incident_start: when the current incident began; None if there was none.
    """
    if incident_start is None:
        return True
    if started_at is not None and started_at > incident_start:
        return True
    return abs((failed_at - incident_start).total_seconds()) > INCIDENT_WINDOW_SECONDS


# --- Reading a Pod ----------------------------------------------------------

def _trainer_state(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    for status in statuses:
        if status.get("name") == C.CONTAINER_NAME:
            return status.get("state") or {}
    return (statuses[0].get("state") or {}) if statuses else {}


def pod_exit_code(pod: Mapping[str, Any]) -> int | None:
    """Exit code of the trainer container, None while it runs or when unknown."""
    terminated = _trainer_state(pod).get("terminated") or {}
    code = terminated.get("exitCode")
    return int(code) if code is not None else None


def pod_finished_at(pod: Mapping[str, Any]) -> str | None:
    """When the trainer container finished (RFC 3339), if the kubelet said."""
    return (_trainer_state(pod).get("terminated") or {}).get("finishedAt")


def pod_created_at(pod: Mapping[str, Any]) -> str | None:
    """metadata.creationTimestamp (RFC 3339), if the API server set it."""
    return (pod.get("metadata") or {}).get("creationTimestamp")


def pod_reason(pod: Mapping[str, Any]) -> str | None:
    """The Pod's status reason, else the container's termination reason."""
    return (pod.get("status") or {}).get("reason") or (_trainer_state(pod).get("terminated") or {}).get("reason")


def pod_disrupted(pod: Mapping[str, Any]) -> bool:
    """The Pod carries DisruptionTarget=True (preempted, drained, tainted away)."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "DisruptionTarget" and c.get("status") == "True" for c in conditions)


def classify_pod(pod: Mapping[str, Any], permanent_exit_codes: Iterable[int] = ()) -> Outcome | None:
    """Outcome of a finished Pod; None while it is still pending or running. A trainer whose
    record carries ``fatal`` (it raised DoNotRetry) said retrying cannot help: permanent."""
    phase = (pod.get("status") or {}).get("phase")
    if phase == "Succeeded":
        return Outcome.SUCCEEDED
    if phase != "Failed":
        return None
    if pod_fatal(pod) is not None:
        return Outcome.PERMANENT
    return classify(pod_exit_code(pod), pod_reason(pod), disrupted=pod_disrupted(pod),
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


def diagnose_pod(pod: Mapping[str, Any], permanent_exit_codes: Iterable[int] = ()) -> Diagnosis | None:
    """Why a Failed pod failed; None when it has not failed (pending, running, succeeded)."""
    outcome = classify_pod(pod, permanent_exit_codes)
    if outcome in (None, Outcome.SUCCEEDED):
        return None
    fatal = pod_fatal(pod)
    if fatal is not None:  # status.failures[].cause has no value of its own for it (yet): PermanentExitCode
        return Diagnosis(outcome, C.CAUSE_PERMANENT, pod_exit_code(pod), fatal["reason"], fatal["message"])
    disruption = _disruption_condition(pod)
    reason = (disruption or {}).get("reason") or pod_reason(pod) or ""
    if outcome == Outcome.DISRUPTION:
        cause = C.CAUSE_NODE_LOST if reason in NODE_LOST_REASONS else C.CAUSE_DISRUPTED
    elif outcome == Outcome.PERMANENT:
        cause = C.CAUSE_PERMANENT
    else:
        cause = C.CAUSE_OOM if pod_reason(pod) == "OOMKilled" else C.CAUSE_ERROR
    return Diagnosis(outcome, cause, pod_exit_code(pod), reason, _failure_message(pod, disruption))


def diagnose_deleted(pod: Mapping[str, Any]) -> Diagnosis | None:
    """A pod being deleted under a DisruptionTarget condition (drained, preempted, node gone)
    before it finished: a disruption worth reporting, though no failure is counted."""
    disruption = _disruption_condition(pod)
    if disruption is None or not (pod.get("metadata") or {}).get("deletionTimestamp"):
        return None
    reason = disruption.get("reason") or ""
    cause = C.CAUSE_NODE_LOST if reason in NODE_LOST_REASONS else C.CAUSE_DISRUPTED
    return Diagnosis(Outcome.DISRUPTION, cause, pod_exit_code(pod), reason, _failure_message(pod, disruption))


def _disruption_condition(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == "DisruptionTarget" and c.get("status") == "True"), None)


def _failure_message(pod: Mapping[str, Any], disruption: Mapping[str, Any] | None) -> str:
    """DisruptionTarget's message, else the trainer's error from its progress record, else the
    kubelet's termination message (a log tail under FallbackToLogsOnError), else the pod's."""
    terminated = _trainer_state(pod).get("terminated") or {}
    found = progress_record.parse(terminated.get("message"))
    record = found.data if isinstance(found, progress_record.Record) else {}
    # A message that holds a record (even one refused) is not a log tail: never show it raw.
    text = ((disruption or {}).get("message") or record.get("error")
            or ("" if found else terminated.get("message")) or (pod.get("status") or {}).get("message") or "")
    text = " ".join(str(text).split())
    return text if len(text) <= MESSAGE_CHARS else "..." + text[-(MESSAGE_CHARS - 3):]  # a log tail ends well


def pod_waiting(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    """The trainer container's waiting state ({} when it is not waiting)."""
    return _trainer_state(pod).get("waiting") or {}


def diagnose_image_pull(pod: Mapping[str, Any], now: datetime, timeout_seconds: float) -> Diagnosis | None:
    """A pod whose image cannot be pulled (see image_pull_stuck): permanent, cause ImagePull."""
    if not image_pull_stuck(pod, now, timeout_seconds):
        return None
    waiting = pod_waiting(pod)
    return Diagnosis(Outcome.PERMANENT, C.CAUSE_IMAGE_PULL, None, waiting.get("reason") or "",
                     waiting.get("message") or "")


def image_pull_stuck(pod: Mapping[str, Any], now: datetime, timeout_seconds: float) -> bool:
    """The trainer image cannot be pulled: a name that can never work, or pull errors for
    longer than `timeout_seconds` after the pod was created (a registry outage may pass)."""
    reason = pod_waiting(pod).get("reason")
    if reason in INVALID_IMAGE_REASONS:
        return True
    if reason not in IMAGE_PULL_REASONS:
        return False
    created = parse_time(pod_created_at(pod))
    return created is not None and (now - created).total_seconds() >= timeout_seconds


# --- Progress reported by the trainer (ddpjob_rdzv/progress_record.py) ------------------------

@dataclass(frozen=True)
class RecordProblem:
    """A progress record that was refused: which pod sent it, where it was found, and why."""

    pod: str  # the pod's name
    uid: str  # the pod's uid: a problem is reported once per pod and field
    source: str  # C.SOURCE_TERMINATION_MESSAGE or C.SOURCE_PROGRESS_ENDPOINT
    invalid: progress_record.Invalid

    @classmethod
    def of(cls, pod: Mapping[str, Any], source: str, invalid: progress_record.Invalid) -> "RecordProblem":
        meta = pod.get("metadata") or {}
        return cls(meta.get("name") or "", meta.get("uid") or "", source, invalid)


def read_progress(message: str | None) -> dict[str, Any] | None:
    """The trainer's progress record in a termination message when it passes the contract;
    None for anything else (a log tail, an empty message, a refused record)."""
    found = progress_record.parse(message)
    return dict(found.data) if isinstance(found, progress_record.Record) else None


def _terminations(pod: Mapping[str, Any]) -> list[str | None]:
    """The trainer container's termination messages: the current and the previous one."""
    messages = []
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == C.CONTAINER_NAME:
            messages += [((status.get(key) or {}).get("terminated") or {}).get("message")
                         for key in ("state", "lastState")]
    return messages


def pod_progress(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Progress records in the trainer container's current and previous terminations
    (refused ones left out: see pod_record_problems)."""
    return [record for record in map(read_progress, _terminations(pod)) if record is not None]


def pod_record_problems(pod: Mapping[str, Any]) -> list[RecordProblem]:
    """The records in the pod's termination messages that the contract refused."""
    found = [progress_record.parse(message) for message in _terminations(pod)]
    return [RecordProblem.of(pod, C.SOURCE_TERMINATION_MESSAGE, f) for f in found
            if isinstance(f, progress_record.Invalid)]


def pod_fatal(pod: Mapping[str, Any]) -> Mapping[str, str] | None:
    """``fatal`` {reason, message} of the record in the trainer's current termination: the
    worker raised DoNotRetry. A refused record says nothing."""
    state = _trainer_state(pod)
    record = read_progress((state.get("terminated") or {}).get("message"))
    return (record or {}).get("fatal")


def permanent_failure(pod: Mapping[str, Any], what: str) -> tuple[str, str]:
    """Reason and message of the job's failure when ``pod`` failed for good: the trainer's own
    (DoNotRetry) when its record says so, else a permanent exit code."""
    fatal = pod_fatal(pod)
    if fatal is not None:
        return fatal["reason"], C.MSG_DO_NOT_RETRY.format(what=what, reason=fatal["reason"])
    return C.REASON_PERMANENT_ERROR, C.MSG_PERMANENT_ERROR.format(what=what)


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


# --- Restart budget by progress ------------------------------------------------------------


def image_pull_check_in(pods: Iterable[Mapping[str, Any]], now: datetime, timeout_seconds: float) -> float | None:
    """Seconds until a pod now failing to pull its image passes the timeout (None: none is),
    so the job fails on time even if the kubelet reports nothing new meanwhile."""
    waits = []
    for pod in pods:
        created = parse_time(pod_created_at(pod))
        if pod_waiting(pod).get("reason") in IMAGE_PULL_REASONS and created is not None:
            waits.append(max(timeout_seconds - (now - created).total_seconds(), 0.0))
    return min(waits) if waits else None
