"""The run's timeline: what happened when, on the run clock, from the run's own records.

`build_timeline` is pure: it reads the runner's events (events.jsonl: started, killed, exited,
phase ...) and the trainer's metrics (start, step, snapshot) and places both on the run clock
`t` (seconds since the run started; a metrics line's wall `time` is moved onto it with the
offset the events carry, each having both). The timeline is the one record the picture is
drawn from (timeline_plot.py) and is written as timeline.json beside it (journal.py), so the
data is there even where the plotting extra is not.

    runs            each trainer start (a new group after a failure): its world size, the step
                    it resumed at and the steps it trained (steps rolled back by the next
                    start stay, as in the metrics file: the picture shows the redone work)
    snapshots       each complete snapshot (t, step)
    kills           the injected SIGKILLs (--kill-node-after)
    failures        node or store exits with a non-zero code
    group_restarts  whole-group restarts under a new rendezvous generation
    promotions      warm spares that took a lost node's place (spec.elasticPolicy.spareReplicas)
    pauses          the spans in phase Restarting (a failure until training resumed)
    nodes_running   agents running over time, from the runner's started/exited/stopped (spares included)
    spares_running  of those, the agents waiting as warm spares
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any, Iterable

from ddpjob_operator.api.clock import parse_time

MAX_STEP_POINTS = 2000  # steps kept over all runs: a long run's picture and JSON stay small


@dataclass(frozen=True)
class Run:
    """One trainer start and the steps it trained: (t, step) pairs."""

    t: float
    world_size: int | None
    resume_step: int | None
    steps: list[tuple[float, int]] = field(default_factory=list)


@dataclass(frozen=True)
class Mark:
    """A moment worth a line on the picture: a kill, a failure, a group restart."""

    t: float
    label: str
    node: int | None = None


@dataclass(frozen=True)
class Timeline:
    """The run on its own clock (see the module docstring for each field)."""

    job: str
    phase: str | None
    end: float
    runs: list[Run]
    snapshots: list[tuple[float, int]]
    kills: list[Mark]
    failures: list[Mark]
    group_restarts: list[Mark]
    pauses: list[tuple[float, float]]
    nodes_running: list[tuple[float, int]]
    promotions: list[Mark] = field(default_factory=list)
    spares_running: list[tuple[float, int]] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1) + "\n"


def last_run(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events of the latest run: a reused run directory appends to events.jsonl, and each
    run's clock starts again at 0. Events without a numeric run clock `t` are dropped."""
    events = [e for e in events if isinstance(e.get("t"), (int, float)) and not isinstance(e.get("t"), bool)]
    start = 0
    for index in range(1, len(events)):
        if events[index]["t"] < events[index - 1]["t"]:
            start = index
    return events[start:]


def build_timeline(job: str, events: list[dict[str, Any]], metrics: list[dict[str, Any]]) -> Timeline:
    """The timeline of the latest run in `events` (events.jsonl) with its `metrics` (metrics.jsonl).

    Metrics lines from before the run started (a reused snapshot directory) are left out.
    """
    events = last_run(events)
    origin = _origin(events)
    end = max((float(e["t"]) for e in events), default=0.0)
    placed = [(_clock(e, origin), e) for e in metrics]
    placed = [(t, e) for t, e in placed if t is not None and t >= 0]
    end = max([end] + [t for t, _ in placed])
    return Timeline(
        job=job, phase=_final_phase(events), end=round(end, 3), runs=_thin(_runs(placed)),
        snapshots=[(t, int(e["step"])) for t, e in placed if e.get("event") == "snapshot" and _is_int(e.get("step"))],
        kills=[Mark(e["t"], f"kill node {e.get('node')}", e.get("node")) for e in events if e.get("event") == "killed"],
        failures=_failures(events),
        group_restarts=[Mark(e["t"], f"group restart (generation {e.get('generation')})")
                        for e in events if e.get("event") == "group_restart"],
        pauses=_pauses(events, end), nodes_running=_nodes_running(events),
        promotions=[Mark(e["t"], f"spare node {e.get('node')} for node {e.get('replaces')}", e.get("node"))
                    for e in events if e.get("event") == "promoted"],
        spares_running=_spares_running(events))


def _origin(events: list[dict[str, Any]]) -> datetime | None:
    """The wall time of the run clock's 0, from the first event that has both clocks."""
    for event in events:
        wall = _wall(event.get("time"))
        if wall is not None:
            return wall - timedelta(seconds=float(event["t"]))
    return None


def _wall(text: Any) -> datetime | None:
    try:
        return parse_time(text) if isinstance(text, str) else None
    except ValueError:  # a line cut short by a crash: the event has no usable time
        return None


def _clock(event: dict[str, Any], origin: datetime | None) -> float | None:
    wall = _wall(event.get("time"))
    return None if wall is None or origin is None else round((wall - origin).total_seconds(), 3)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _runs(placed: list[tuple[float, dict[str, Any]]]) -> list[Run]:
    starts: list[tuple[float, Any, Any]] = []  # (t, world size, resume step) of each trainer start
    steps: list[list[tuple[float, int]]] = []
    for t, event in placed:
        kind = event.get("event")
        if kind == "start":
            starts.append((t, event.get("world_size"), event.get("resume_step")))
            steps.append([])
        elif kind == "step" and _is_int(event.get("step")):
            if not starts:  # steps whose start line was lost: a run of unknown size
                starts.append((t, event.get("world_size"), None))
                steps.append([])
            steps[-1].append((t, event["step"]))
    return [Run(t, size, resume, run_steps) for (t, size, resume), run_steps in zip(starts, steps)]


def _thin(runs: list[Run]) -> list[Run]:
    """At most about MAX_STEP_POINTS steps: every k-th of each run, and each run's last."""
    total = sum(len(r.steps) for r in runs)
    if total <= MAX_STEP_POINTS:
        return runs
    every = -(-total // MAX_STEP_POINTS)
    return [Run(r.t, r.world_size, r.resume_step,
                [s for i, s in enumerate(r.steps) if i % every == 0 or i == len(r.steps) - 1]) for r in runs]


def _failures(events: Iterable[dict[str, Any]]) -> list[Mark]:
    marks = []
    for event in events:
        code = event.get("code")
        if event.get("event") == "exited" and code not in (0, None):
            marks.append(Mark(event["t"], f"node {event.get('node')} exit {code}", event.get("node")))
        elif event.get("event") == "store_exited" and code not in (0, None):
            marks.append(Mark(event["t"], f"store exit {code}"))
    return marks


def _final_phase(events: list[dict[str, Any]]) -> str | None:
    """The phase the run ended in (the runner writes it last, with a message)."""
    final = [e for e in events if e.get("event") == "phase" and e.get("message")]
    return final[-1].get("phase") if final else None


def _pauses(events: list[dict[str, Any]], end: float) -> list[tuple[float, float]]:
    spans, since = [], None
    for event in events:
        if event.get("event") != "phase":
            continue
        if event.get("phase") == "Restarting":
            since = event["t"] if since is None else since
        elif since is not None:
            spans.append((since, event["t"]))
            since = None
    if since is not None:
        spans.append((since, end))
    return spans


def _nodes_running(events: list[dict[str, Any]]) -> list[tuple[float, int]]:
    running: set[Any] = set()
    points = [(0.0, 0)]
    for event in events:
        if event.get("event") == "started":
            running.add(event.get("node"))
        elif event.get("event") in ("exited", "stopped") and "node" in event:
            running.discard(event.get("node"))
        else:
            continue
        points.append((event["t"], len(running)))
    return points


def _spares_running(events: list[dict[str, Any]]) -> list[tuple[float, int]]:
    """Agents in the spare role over time: started as a spare, until promoted, exited or stopped."""
    spares: set[Any] = set()
    points = [(0.0, 0)]
    for event in events:
        kind, node = event.get("event"), event.get("node")
        if kind == "started" and event.get("spare"):
            spares.add(node)
        elif kind in ("promoted", "exited", "stopped") and node in spares:
            spares.discard(node)
        else:
            continue
        points.append((event["t"], len(spares)))
    return points
