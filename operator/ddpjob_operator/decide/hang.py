"""Hangs: every pod runs, yet no training step advances (pure).

Each pass of a running job reads one node's progress record, whose ``nodes`` list holds every
node's heartbeat (step, phase, step time; ddpjob_trainer/report/record.py). From it this module
keeps ``status.progress``: the highest step, the median step time, and ``advancedTime``, when the
operator (on its own clock: the pods' clocks may be skewed) saw the step change or a new run
start. The hang clock runs only once the current run has taken a step, so a slow start (loading
a snapshot, the first batch) is never a hang. A pass reads the previous progress from the status
the operator kept, written or not (decide/writes.py: routine progress is written at most once per
--status-write-interval-seconds), so the clock moves at every poll while the stored status lags.

When the step has not advanced for the hang timeout while every node pod of the current group
runs, the job has hung: the group restarts from the last snapshot (a new rendezvous generation,
as when the c10d store is lost), one failure incident charged by the progress rule (budget.py),
and ``status.failures`` gets a ``Hang`` entry naming the step and the stalled nodes.

The timeout is ``failurePolicy.hangTimeoutSeconds``; left out, max(HANG_TIMEOUT_FLOOR_SECONDS,
HANG_STEP_FACTOR x the median step time); 0 turns detection off. Detection waits for a pass
that read the record, so it comes at most one progress poll (--progress-poll-seconds) late.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Mapping

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.clock import format_time, parse_time, seconds_between
from ddpjob_operator.api.spec import DDPJobSpec, FailurePolicy
from ddpjob_operator.decide.budget import ledger_fields, ledger_of, open_incident
from ddpjob_operator.decide.failure import failure_entry
from ddpjob_operator.decide.observed import Liveness, NodeBeat, PodView

STALE_HEARTBEAT_SECONDS = 10.0  # a node whose heartbeat trails the newest by this much has stopped beating


def hang_timeout(policy: FailurePolicy, step_seconds: float | None) -> float:
    """The hang timeout in force: the spec's, else derived from the step time (0: off)."""
    if policy.hang_timeout_seconds is not None:
        return float(policy.hang_timeout_seconds)
    return max(C.HANG_TIMEOUT_FLOOR_SECONDS, C.HANG_STEP_FACTOR * (step_seconds or 0.0))


def tracked(policy: FailurePolicy, previous: Mapping[str, Any] | None, live: Liveness | None,
            now: datetime) -> dict[str, Any]:
    """status.progress's step fields after this pass (the straggler fields are straggler.py's).

    The clock (advancedTime) restarts when the step changes or a new run is polled; it is unset
    while the run has taken no step (no node reports a step time yet).
    """
    progress = dict(previous or {})
    if live is None:
        return progress  # no record this pass: nothing new is known
    times = [n.step_seconds for n in live.nodes if n.step_seconds is not None]
    step_seconds = round(statistics.median(times), 4) if times else None
    new_run = _newer(live.run, progress.get("run"))
    if not times:
        advanced = None
    elif new_run or progress.get("step") != live.step or not progress.get("advancedTime"):
        advanced = format_time(now)
    else:
        advanced = progress["advancedTime"]
    progress.update(step=live.step, stepSeconds=step_seconds, run=live.run if new_run else progress.get("run"),
                    advancedTime=advanced, hangTimeoutSeconds=hang_timeout(policy, step_seconds))
    return progress


def _newer(run: str | None, known: str | None) -> bool:
    """A run that started after the one known: torchrun restarted the workers. The nodes of one run
    start seconds apart and a pass may read any of them, so an older start is the same run (or
    an older one), not a reason to restart the clock."""
    started, before = parse_time(run), parse_time(known)
    return started is not None and (before is None or started > before)


@dataclass(frozen=True)
class Hang:
    """A hang found: how long the step stood still, the timeout, the step and the stalled nodes."""

    seconds: float
    timeout: float
    step: int | None
    nodes: tuple[str, ...]


def detect(progress: Mapping[str, Any], live: Liveness | None, all_running: bool, now: datetime) -> Hang | None:
    """The hang, if the step has stood still for the timeout while every node pod runs; else None.
    Only a pass that read the nodes' heartbeats decides (one without them knows nothing new)."""
    timeout, advanced = progress.get("hangTimeoutSeconds"), parse_time(progress.get("advancedTime"))
    if live is None or not all_running or not timeout or advanced is None:
        return None
    waited = seconds_between(advanced, now)
    if waited < timeout:
        return None
    return Hang(waited, float(timeout), live.step, stalled_nodes(live.nodes))


def stalled_nodes(nodes: tuple[NodeBeat, ...]) -> tuple[str, ...]:
    """The nodes whose progress stopped first: those that stopped beating (a frozen process or
    host), else those still outside the step's collectives while others wait in one (stuck in
    input, I/O or their own code), else every node (stuck together, in a collective)."""
    beats = [n.heartbeat for n in nodes if n.heartbeat is not None]
    if beats:
        newest = max(beats)
        silent = [n.node for n in nodes if n.heartbeat is not None
                  and seconds_between(n.heartbeat, newest) >= STALE_HEARTBEAT_SECONDS]
        if silent:
            return tuple(silent)
    local = [n.node for n in nodes if n.phase == "local"]
    if local and len(local) < len(nodes):
        return tuple(local)
    return tuple(n.node for n in nodes)


@dataclass(frozen=True)
class HangRestart:
    """The whole-group restart a hang causes: its message, status changes and failure entry."""

    message: str
    changes: dict[str, Any]  # rendezvousGeneration, progress, and the ledger when a new incident opened
    failure: dict[str, Any]  # the status.failures entry (cause Hang)


def begin_hang_restart(spec: DDPJobSpec, status: Mapping[str, Any], hang: Hang, pods: tuple[PodView, ...],
                       now: datetime) -> HangRestart:
    """Bumps rendezvousGeneration (plan.py deletes the old group and creates a new one, which
    resumes from the last snapshot) and opens one failure incident (judged by progress later in
    the pass, like any other); the hang clock restarts with the new run."""
    generation = int(status.get("rendezvousGeneration") or 0) + 1
    opened = open_incident(ledger_of(status), now, None)
    snapshot = (status.get("lastSnapshot") or {}).get("step")
    budget = (f"one failure incident, charged to spec.failurePolicy.maxRestarts ({spec.failure_policy.max_restarts}) "
              "unless a newer snapshot was complete" if opened else "part of the failure incident already open")
    origin = "spec.failurePolicy.hangTimeoutSeconds" if spec.failure_policy.hang_timeout_seconds is not None else \
        f"derived: max({C.HANG_TIMEOUT_FLOOR_SECONDS:.0f}s, {C.HANG_STEP_FACTOR:g} x the step time)"
    message = C.MSG_HANG.format(seconds=hang.seconds, timeout=hang.timeout, origin=origin, step=hang.step,
                                nodes=", ".join(hang.nodes) or "unknown", snapshot=snapshot, generation=generation,
                                budget=budget)
    progress = {k: v for k, v in (status.get("progress") or {}).items() if k not in ("advancedTime", "run")}
    changes = {**(ledger_fields(opened, status) if opened else {}), "rendezvousGeneration": generation,
               "progress": progress}
    return HangRestart(message, changes, _failure(hang, pods, now))


def _failure(hang: Hang, pods: tuple[PodView, ...], now: datetime) -> dict[str, Any]:
    """The Hang entry of status.failures: the first stalled node's pod, the step and all stalled nodes
    (the Event says the rest)."""
    message = f"no training step for {hang.seconds:.0f}s (hang timeout {hang.timeout:.0f}s)"
    by_index = {str(p.index): p for p in pods if p.index is not None}
    pod = next((by_index[n] for n in hang.nodes if n in by_index), None)
    return failure_entry(pod, C.CAUSE_HANG, C.REASON_HANG, message, now, step=hang.step,
                         stalledNodes=list(hang.nodes))
