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
from typing import Iterable

from ddpjob_operator.api.clock import parse_time, seconds_between
from ddpjob_operator.decide import spares
from ddpjob_operator.decide.observed import PodView
from ddpjob_operator.api.spec import DDPJobSpec






def is_scheduled(pod: PodView) -> bool:
    """Bound to a node: spec.nodeName set, PodScheduled True, or already past Pending."""
    if pod.node_name or pod.condition("PodScheduled").get("status") == "True":
        return True
    return pod.phase != "Pending"


def waiting_reason(pod: PodView) -> str | None:
    """'<reason>: <message>' of an active pod the scheduler has not placed (Unschedulable,
    or SchedulingGated while a queue such as Kueue holds it); None otherwise."""
    cond = pod.condition("PodScheduled")
    if not pod.active or is_scheduled(pod) or cond.get("status") != "False":
        return None
    reason, message = cond.get("reason") or "Unschedulable", cond.get("message") or ""
    return f"{reason}: {message}" if message else reason


def waiting_since(pod: PodView) -> datetime | None:
    """When the scheduler first could not place the pod (else when the pod was created)."""
    return parse_time(pod.condition("PodScheduled").get("lastTransitionTime")) or pod.created_at


def node_counts(spec: DDPJobSpec, nodes: Iterable[PodView]) -> dict[str, int]:
    """desired/scheduled/running/rendezvous/spare counts over the current generation's node pods."""
    active = [p for p in nodes if p.active]
    return {
        "desiredReplicas": spec.desired_replicas,
        "scheduledReplicas": sum(1 for p in active if is_scheduled(p)),
        "runningReplicas": sum(1 for p in active if p.phase == "Running"),
        "rendezvousReplicas": spares.in_round(spec, ready := sum(1 for p in active if p.running_ready)),
        "spares": spares.waiting(spec, ready),
    }


def unschedulable(nodes: Iterable[PodView]) -> list[str]:
    """status.unschedulable: '<pod>: <reason>: <message>' for each node pod waiting for the scheduler."""
    return sorted(f"{p.name}: {r}" for p in nodes if (r := waiting_reason(p)))


def overdue(spec: DDPJobSpec, nodes: Iterable[PodView], now: datetime) -> list[str]:
    """Entries of `unschedulable` for pods that waited longer than pendingTimeoutSeconds."""
    timeout = spec.scheduling.pending_timeout_seconds
    late = [p for p in nodes if waiting_reason(p) and _waited(p, now) >= timeout]
    return unschedulable(late)


def next_overdue_in(spec: DDPJobSpec, nodes: Iterable[PodView], now: datetime) -> float | None:
    """Seconds until the next waiting pod passes the timeout (a requeue: nothing else
    would wake the operator then); None when no pod is about to."""
    timeout = spec.scheduling.pending_timeout_seconds
    left = [timeout - _waited(p, now) for p in nodes if waiting_reason(p)]
    left = [s for s in left if s > 0]
    return min(left) if left else None


def _waited(pod: PodView, now: datetime) -> float:
    since = waiting_since(pod)
    return seconds_between(since, now) if since else 0.0


def capacity_effect(spec: DDPJobSpec, running: int) -> str:
    """What the missing capacity means for training, for the condition message."""
    if running >= spec.min_replicas:
        return (f"training continues on {running} node(s) (minReplicas {spec.min_replicas}); "
                "the others join when scheduled")
    return f"training waits: {running} of minReplicas {spec.min_replicas} node(s) running"
