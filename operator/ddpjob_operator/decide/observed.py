"""Read the facts plan and status need from observed Pod dicts (pure helpers)."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from ddpjob_operator.api import constants as C

Pod = Mapping[str, Any]
ACTIVE_PHASES = ("Pending", "Running", "Unknown")  # a pod in these may still do work


def pod_index(pod: Pod) -> int | None:
    """Node index from the ddpjob.io/node-index label; None when absent or malformed."""
    raw = ((pod.get("metadata") or {}).get("labels") or {}).get(C.LABEL_NODE_INDEX)
    return int(raw) if isinstance(raw, str) and raw.isdigit() else None


def pod_uid(pod: Pod) -> str:
    """metadata.uid ('' when the emulator or a test left it out)."""
    return (pod.get("metadata") or {}).get("uid") or ""


def pod_name_of(pod: Pod) -> str:
    """metadata.name."""
    return (pod.get("metadata") or {}).get("name") or ""


def pod_phase(pod: Pod) -> str:
    """status.phase; a pod without status is Pending (just created)."""
    return (pod.get("status") or {}).get("phase") or "Pending"


def is_deleting(pod: Pod) -> bool:
    """The pod has a deletionTimestamp: it is going away and must not be counted or reused."""
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def is_active(pod: Pod) -> bool:
    """Not deleting and not finished."""
    return not is_deleting(pod) and pod_phase(pod) in ACTIVE_PHASES


def is_ready(pod: Pod) -> bool:
    """Running with the Ready condition True."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    return is_active(pod) and pod_phase(pod) == "Running" and ready


def current_pods(pods: Iterable[Pod], replicas: int) -> list[Pod]:
    """Pods with a node index below `replicas` that are not being deleted."""
    return [p for p in pods if not is_deleting(p) and (pod_index(p) is not None)
            and pod_index(p) < replicas]


def is_store_pod(pod: Mapping[str, Any]) -> bool:
    """The pod is a job's dedicated rendezvous store."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return labels.get(C.LABEL_COMPONENT) == C.COMPONENT_RDZV_STORE
