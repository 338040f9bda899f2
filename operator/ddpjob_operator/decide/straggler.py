"""Stragglers: a node that is alive but slow, and drags every step of the group (pure).

In data-parallel training every step waits for the slowest rank, so all nodes report the same
wall time per step. What differs is each node's *own* time, the part of a step no peer holds up
(input + forward, ddpjob_trainer/progress_report.StepClock): a slow node spends longer there and
the others wait for it in backward's all-reduce. So the slowest node is the one with the most
own time, and how much it costs the group is

    slowdown = step time / (step time - (its own time - the other nodes' median own time))

the group's step time over what it would be if that node kept pace with the median. It is
shown in ``status.progress`` (slowestNode, slowdown) and a metric. When it stays at or above
``stragglerPolicy.threshold`` for ``stragglerPolicy.windowSeconds`` a Straggler Warning Event is
posted (once per slow spell); under ``action: Replace`` the node's pod is also deleted (plan.py)
and created again, recorded in ``status.failures`` with cause ``Straggler`` and its Kubernetes
node, which replacements then avoid. A replacement is not charged to the restart budget: the
node did not fail, and the operator chose to move it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Iterable, Mapping

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.clock import format_time, parse_time, seconds_between
from ddpjob_operator.api.spec import StragglerPolicy
from ddpjob_operator.decide.actions import Event
from ddpjob_operator.decide.failure import failure_entry
from ddpjob_operator.decide.observed import Liveness, PodView

MIN_REST_FRACTION = 0.01  # the step time without the slow node's excess is at least this much of it (no /0)
FIELDS = ("slowestNode", "slowdown", "slowSince", "reportedStraggler")  # this module's keys of status.progress


@dataclass(frozen=True)
class Slowest:
    """The slowest node: its index, its slowdown, its own time and the other nodes' median."""

    node: str
    slowdown: float
    own: float
    median: float


def slowest(live: Liveness | None) -> Slowest | None:
    """The node with the most own time per step, and what it costs (None with fewer than two
    nodes reporting step figures: nothing to compare with)."""
    nodes = [n for n in (live.nodes if live else ()) if n.own_seconds is not None and n.step_seconds]
    if len(nodes) < 2:
        return None
    worst = max(nodes, key=lambda n: n.own_seconds)
    median = statistics.median(n.own_seconds for n in nodes if n is not worst)
    step = statistics.median(n.step_seconds for n in nodes)
    excess = max(worst.own_seconds - median, 0.0)
    slowdown = step / max(step - excess, MIN_REST_FRACTION * step)
    return Slowest(worst.node, round(slowdown, 2), worst.own_seconds, median)


@dataclass(frozen=True)
class Verdict:
    """What the pass decided about stragglers: status.progress fields, Events, and a failure
    entry for a pod to replace (plan.py deletes pods named by Straggler entries)."""

    progress: dict[str, Any]
    events: list[Event] = field(default_factory=list)
    replace: dict[str, Any] | None = None


def judge(policy: StragglerPolicy, progress: Mapping[str, Any], live: Liveness | None,
          pods: Iterable[PodView], now: datetime) -> Verdict:
    """Updates the slow-spell bookkeeping in status.progress and decides Events and replacement."""
    kept = {k: progress.get(k) for k in FIELDS}
    if live is None:
        return Verdict(kept)  # no record this pass: nothing new is known
    found = slowest(live)
    if found is None:
        return Verdict({k: None for k in FIELDS})
    over = found.slowdown >= policy.threshold and policy.action != "Ignore"
    same = kept["slowestNode"] == found.node
    since = (kept["slowSince"] if same and kept["slowSince"] else format_time(now)) if over else None
    reported = kept["reportedStraggler"] if over and same else None
    result = {"slowestNode": found.node, "slowdown": found.slowdown, "slowSince": since, "reportedStraggler": reported}
    if not over or reported == found.node or seconds_between(parse_time(since), now) < policy.window_seconds:
        return Verdict(result)
    seconds = seconds_between(parse_time(since), now)
    pod = next((p for p in pods if str(p.index) == found.node and p.phase == "Running" and not p.deleting), None)
    replace = policy.action == "Replace" and pod is not None
    message = C.MSG_STRAGGLER.format(node=found.node, pod=pod.name if pod else "?", slowdown=found.slowdown,
                                     seconds=seconds, threshold=policy.threshold, own=found.own, median=found.median,
                                     action=C.MSG_STRAGGLER_REPLACING if replace else "")
    events = [Event(C.EVENT_WARNING, C.REASON_STRAGGLER_REPLACED if replace else C.REASON_STRAGGLER, message)]
    if not replace:
        return Verdict({**result, "reportedStraggler": found.node}, events)
    # The replacement starts a new spell: if it is slow too, it is judged afresh.
    return Verdict({**result, "slowSince": None}, events,
                   failure_entry(pod, C.CAUSE_STRAGGLER, C.REASON_STRAGGLER, message, now))




def to_replace(failures: Iterable[Mapping[str, Any]] | None) -> set[str]:
    """uids of the pods status.failures says to replace as stragglers."""
    return {f["podUID"] for f in failures or [] if f.get("cause") == C.CAUSE_STRAGGLER and f.get("podUID")}
