"""Pods stuck terminating on a node that is down: force-delete them so a replacement can start (pure).

A pod is deleted gracefully: the API server sets ``deletionTimestamp`` (the request time plus
the grace period) and waits for the kubelet to confirm the containers stopped. A kubelet on
a NotReady or vanished node never confirms, so the pod stays Terminating forever and its name
(which the replacement needs, pod names are stable per index) stays taken. Once
``failurePolicy.forceDeleteTerminatingAfterSeconds`` passed after ``deletionTimestamp`` and the
pod's node is NotReady, Unknown or gone, the operator deletes it with grace period 0, as
``kubectl delete --force --grace-period=0`` would. On a Ready node the kubelet will finish
the deletion itself, so the pod is left alone however long it takes.

Kueue-queued jobs (spec.scheduling.queueName): their node pods carry Kueue's
``safe-to-forcefully-delete`` annotation, so Kueue's FailureRecoveryPolicy may force-delete
them itself. DDPJob steps aside by waiting ``C.KUEUE_FORCE_DELETE_HEAD_START_SECONDS`` more,
so the policy that admitted the pods acts first where it is on; DDPJob stays the fallback
where it is off (it is alpha, off by default), since a pod stuck forever would block its
replacement forever. Both acting is harmless: a delete names the pod's uid and a pod already
gone is skipped.

The risk that makes Kubernetes itself wait is a partitioned node whose containers still run.
Its workers cannot pass a collective without the rest of the group, so they stop training; at
worst an old rank 0 finishes a snapshot it was writing (atomically, under its own name). The
timeout gives a node that is only briefly NotReady time to come back first.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Iterable, Mapping

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.clock import seconds_between
from ddpjob_operator.api.spec import DDPJobSpec
from ddpjob_operator.decide.actions import Action, DeletePod, Event, with_one_requeue
from ddpjob_operator.decide.observed import Node, PodView, node_state



@dataclass(frozen=True)
class StuckPod:
    """A pod to force-delete, and why."""

    name: str
    uid: str
    node: str
    node_state: str  # "NotReady", "Unknown" or "gone"
    seconds: float  # how long past its deletionTimestamp


def overdue_seconds(pod: PodView, now: datetime) -> float | None:
    """Seconds since the pod's deletionTimestamp; None when it is not being deleted."""
    return None if pod.deletion_at is None else seconds_between(pod.deletion_at, now)


def nodes_to_read(pods: Iterable[PodView], now: datetime) -> list[str]:
    """Nodes of pods still there after their deletionTimestamp (a pod not yet scheduled has
    none: the API server deletes it at once): only these need a look."""
    return sorted({p.node_name for p in pods if p.node_name and (overdue_seconds(p, now) or -1) > 0})


def stuck_pods(pods: Iterable[PodView], nodes: Mapping[str, Node | None], now: datetime,
               timeout_seconds: float | None) -> tuple[list[StuckPod], float | None]:
    """The pods to force-delete now, and when to look again for one that will be due.

    Args:
        pods: the job's pods.
        nodes: node name -> Node object (None: the node does not exist). A node missing from
            the mapping is unknown (not read, or reading was forbidden): its pods are left alone.
        now: the current time.
        timeout_seconds: failurePolicy.forceDeleteTerminatingAfterSeconds; None turns this off.
    """
    if timeout_seconds is None:
        return [], None
    due, wait = [], None
    for pod in pods:
        overdue, node = overdue_seconds(pod, now), pod.node_name
        if overdue is None or not node:
            continue
        if overdue < timeout_seconds:
            left = timeout_seconds - overdue
            wait = left if wait is None else min(wait, left)
            continue
        if node not in nodes:
            continue
        state = node_state(nodes[node])
        if state != "Ready":
            due.append(StuckPod(pod.name, pod.uid, node, state, overdue))
    return due, wait


def message(pod: StuckPod, timeout_seconds: float, head_start: int = 0) -> str:
    kueue = C.MSG_KUEUE_HEAD_START.format(seconds=head_start) if head_start else ""
    return C.MSG_FORCE_DELETED.format(pod=pod.name, seconds=pod.seconds, node=pod.node, node_state=pod.node_state,
                                      timeout=timeout_seconds, kueue=kueue)


def kueue_head_start(spec: DDPJobSpec) -> int:
    """Seconds DDPJob's force-delete waits on top of its own timeout so Kueue's acts first (0: not queued)."""
    return C.KUEUE_FORCE_DELETE_HEAD_START_SECONDS if spec.scheduling.queue_name else 0


def with_force_deletions(spec: DDPJobSpec | None, pods: Iterable[PodView], nodes: Mapping[str, Node | None],
                         now: datetime, actions: list[Action]) -> tuple[list[Action], list[Event]]:
    """`actions` plus a grace-period-0 DeletePod per stuck pod (replacing a plain delete of the
    same pod), with the Requeue moved earlier when a pod will be due sooner; and their Events."""
    if spec is None:
        return actions, []
    timeout, head_start = spec.failure_policy.force_delete_terminating_after_seconds, kueue_head_start(spec)
    due, wait = stuck_pods(pods, nodes, now, None if timeout is None else timeout + head_start)
    forced = {p.name for p in due}
    result: list[Action] = [a for a in actions if not (isinstance(a, DeletePod) and a.name in forced)]
    said = [message(p, timeout, head_start) for p in due]
    result += [DeletePod(p.name, text, grace_period_seconds=0) for p, text in zip(due, said)]
    return with_one_requeue(result, wait), [Event(C.EVENT_WARNING, C.REASON_FORCE_DELETED, text) for text in said]
