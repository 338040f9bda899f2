"""Capacity: node counts, pods the scheduler could not place, and queueing labels.

Pure. Elasticity here is driven by capacity: the job asks for `replicas` nodes and trains
as soon as `minReplicas` run (torchrun --nnodes=MIN:MAX admits late joiners, which
trigger a re-rendezvous that includes them). A node pod the scheduler cannot place never
blocks the job; after `spec.scheduling.pendingTimeoutSeconds` it is reported with the
scheduler's own words (the PodScheduled condition: reason Unschedulable, message like
"0/3 nodes are available: 3 Insufficient nvidia.com/gpu.") so a person can act.

"In rendezvous" is estimated as Ready node pods: the operator has no access to the
rendezvous store (nor exec into pods), and an agent's container is Ready once it runs.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Iterable, Mapping

from ddpjob_operator.api.clock import parse_time, seconds_between
from ddpjob_operator.decide.observed import is_active, is_ready, pod_name_of, pod_phase
from ddpjob_operator.api.spec import DDPJobSpec

Pod = Mapping[str, Any]




def _scheduled_condition(pod: Pod) -> Mapping[str, Any]:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == "PodScheduled"), {})


def is_scheduled(pod: Pod) -> bool:
    """Bound to a node: spec.nodeName set, PodScheduled True, or already past Pending."""
    if (pod.get("spec") or {}).get("nodeName") or _scheduled_condition(pod).get("status") == "True":
        return True
    return pod_phase(pod) != "Pending"


def waiting_reason(pod: Pod) -> str | None:
    """'<reason>: <message>' of an active pod the scheduler has not placed (Unschedulable,
    or SchedulingGated while a queue such as Kueue holds it); None otherwise."""
    cond = _scheduled_condition(pod)
    if not is_active(pod) or is_scheduled(pod) or cond.get("status") != "False":
        return None
    reason, message = cond.get("reason") or "Unschedulable", cond.get("message") or ""
    return f"{reason}: {message}" if message else reason


def waiting_since(pod: Pod) -> datetime | None:
    """When the scheduler first could not place the pod (else when the pod was created)."""
    return parse_time(_scheduled_condition(pod).get("lastTransitionTime")) or parse_time(
        (pod.get("metadata") or {}).get("creationTimestamp"))


def node_counts(spec: DDPJobSpec, nodes: Iterable[Pod]) -> dict[str, int]:
    """desired/scheduled/running/rendezvous counts over the current generation's node pods."""
    active = [p for p in nodes if is_active(p)]
    return {
        "desiredReplicas": spec.desired_replicas,
        "scheduledReplicas": sum(1 for p in active if is_scheduled(p)),
        "runningReplicas": sum(1 for p in active if pod_phase(p) == "Running"),
        "rendezvousReplicas": sum(1 for p in active if is_ready(p)),
    }


def unschedulable(nodes: Iterable[Pod]) -> list[str]:
    """status.unschedulable: '<pod>: <reason>: <message>' for each node pod waiting for the scheduler."""
    return sorted(f"{pod_name_of(p)}: {r}" for p in nodes if (r := waiting_reason(p)))


def overdue(spec: DDPJobSpec, nodes: Iterable[Pod], now: datetime) -> list[str]:
    """Entries of `unschedulable` for pods that waited longer than pendingTimeoutSeconds."""
    timeout = spec.scheduling.pending_timeout_seconds
    late = [p for p in nodes if waiting_reason(p) and _waited(p, now) >= timeout]
    return unschedulable(late)


def next_overdue_in(spec: DDPJobSpec, nodes: Iterable[Pod], now: datetime) -> float | None:
    """Seconds until the next waiting pod passes the timeout (a requeue: nothing else
    would wake the operator then); None when no pod is about to."""
    timeout = spec.scheduling.pending_timeout_seconds
    left = [timeout - _waited(p, now) for p in nodes if waiting_reason(p)]
    left = [s for s in left if s > 0]
    return min(left) if left else None


def _waited(pod: Pod, now: datetime) -> float:
    since = waiting_since(pod)
    return seconds_between(since, now) if since else 0.0


def capacity_effect(spec: DDPJobSpec, running: int) -> str:
    """What the missing capacity means for training, for the condition message."""
    if running >= spec.min_replicas:
        return (f"training continues on {running} node(s) (minReplicas {spec.min_replicas}); "
                "the others join when scheduled")
    return f"training waits: {running} of minReplicas {spec.min_replicas} node(s) running"
