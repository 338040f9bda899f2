"""Failure policy: what a finished node means, and when to try again.

Pure and fed with plain values (exit code, reason, flags, counts) so that the
operator (from Pod status) and `ddpjob run` (from local processes) decide alike.
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any, Iterable, Mapping

from . import constants as C

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


def backoff_seconds(restarts: int, base: float, maximum: float) -> float:
    """Delay before replacement number `restarts` (1-based): base, 2*base, 4*base ... <= maximum."""
    if restarts <= 0:
        return 0.0
    return float(min(base * 2 ** min(restarts - 1, 32), maximum))


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


def budget_exhausted(restarts: int, max_restarts: int) -> bool:
    """True when `restarts` incidents are more than the policy recovers from."""
    return restarts > max_restarts


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
    """Outcome of a finished Pod; None while it is still pending or running."""
    phase = (pod.get("status") or {}).get("phase")
    if phase == "Succeeded":
        return Outcome.SUCCEEDED
    if phase != "Failed":
        return None
    return classify(pod_exit_code(pod), pod_reason(pod), disrupted=pod_disrupted(pod),
                    permanent_exit_codes=permanent_exit_codes)
