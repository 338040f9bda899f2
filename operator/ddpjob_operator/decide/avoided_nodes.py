"""Bad nodes stay bad: which Kubernetes nodes a job's replacement pods must avoid (pure).

A node that lost a pod to a node-caused failure is listed in ``status.avoidedNodes``
[{node, cause, since}] and every node pod created afterwards carries a required node
anti-affinity to it (render/node_pod.py: ``kubernetes.io/hostname NotIn [...]``), for the rest
of the job. Node-caused, from the entries of ``status.failures`` (failure.failure_entry
records the pod's node):

  * ``NodeLost``: the pod went with its node (shutdown, taint manager, pod GC);
  * ``Straggler``: a slow node replaced under stragglerPolicy: Replace;
  * ``PreflightFailed``: the pod's pre-flight check failed (render/preflight.py) while no other
    node failed within budget.INCIDENT_WINDOW_SECONDS (a check failing everywhere at once is
    the job's configuration, e.g. a read-only snapshot claim, not a node);
  * ``RepeatedFailures``: the node's pods exited with Error or OOMKilled
    C.AVOID_AFTER_FAILURES times, each time alone (no other node failed within
    budget.INCIDENT_WINDOW_SECONDS). A crash on every node at once is the code's (or the
    data's) fault, and avoiding every node would leave the job nowhere to run.

A plain eviction or preemption (``Disrupted``) says nothing about the node and is not counted.
The list is bounded (C.MAX_AVOIDED_NODES, oldest dropped first, see there); only failures new
in this pass add to it, so a node dropped from a full list is not added straight back.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.clock import parse_time, seconds_between
from ddpjob_operator.decide.actions import Event
from ddpjob_operator.decide.budget import INCIDENT_WINDOW_SECONDS

NODE_CAUSES = (C.CAUSE_NODE_LOST, C.CAUSE_STRAGGLER)  # one such failure is enough
EXIT_CAUSES = (C.CAUSE_ERROR, C.CAUSE_OOM)  # counted only when the node failed alone, C.AVOID_AFTER_FAILURES times


def names(status: Mapping[str, Any]) -> list[str]:
    """The nodes replacement pods must avoid (status.avoidedNodes), for render_pod."""
    return [e["node"] for e in status.get("avoidedNodes") or [] if e.get("node")]


def updated(previous: Iterable[Mapping[str, Any]] | None, failures: Iterable[Mapping[str, Any]] | None,
            avoided: Iterable[Mapping[str, Any]] | None) -> tuple[list[dict[str, Any]] | None, list[Event]]:
    """status.avoidedNodes after this pass, and a NodeAvoided Event per node added.

    Args:
        previous: status.failures before this pass.
        failures: status.failures after it (the new entries are those whose podUID is new).
        avoided: status.avoidedNodes before this pass.
    """
    failures = list(failures or [])
    seen = {f.get("podUID") for f in previous or []}
    result = [dict(e) for e in avoided or []]
    events = []
    for entry in failures:
        node = entry.get("node")
        if entry.get("podUID") in seen or not node or node in {e["node"] for e in result}:
            continue
        cause = _node_cause(entry, failures)
        if cause is not None:
            result.append({"node": node, "cause": cause, "since": entry.get("time")})
            events.append(Event(C.EVENT_WARNING, C.REASON_NODE_AVOIDED, C.MSG_NODE_AVOIDED.format(node=node, cause=cause)))
    return result[-C.MAX_AVOIDED_NODES:] or None, events


def _node_cause(entry: Mapping[str, Any], failures: list[Mapping[str, Any]]) -> str | None:
    """Why the node of failure `entry` is to be avoided; None when it is not (yet)."""
    cause = entry.get("cause")
    if cause in NODE_CAUSES:
        return cause
    if cause == C.CAUSE_PREFLIGHT:
        return cause if _alone(entry, failures) else None
    if cause not in EXIT_CAUSES:
        return None
    lone = [f for f in failures if f.get("node") == entry["node"] and f.get("cause") in EXIT_CAUSES
            and _alone(f, failures)]
    return C.CAUSE_REPEATED_FAILURES if len(lone) >= C.AVOID_AFTER_FAILURES else None


def _alone(entry: Mapping[str, Any], failures: list[Mapping[str, Any]]) -> bool:
    """No failure on another node within the incident window of this one."""
    at = parse_time(entry.get("time"))
    if at is None:
        return False
    for other in failures:
        when = parse_time(other.get("time"))
        if other.get("node") != entry.get("node") and when is not None \
                and abs(seconds_between(at, when)) <= INCIDENT_WINDOW_SECONDS:
            return False
    return True
