"""What the terminal view shows, built from the trainer's metrics and the runner's events.

Pure: `apply_metric` folds one metrics line (the trainer's JSON-lines contract,
see ddpjob_trainer.report.metrics) into a RunState, `apply_node_event` one runner
event; both return the log line worth printing for it, if any.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

# Node states shown in the view.
STARTING = "starting"  # agent started, no training step seen since
RUNNING = "running"
BACKOFF = "backoff"  # failed; the replacement waits for the failure policy's backoff
SUCCEEDED = "succeeded"
FAILED = "failed"  # exited non-zero and is not replaced
STOPPED = "stopped"  # stopped by the runner (run over, or Ctrl-C)
SPARE = "spare"  # a warm spare: started, waiting outside the group for a lost node's place


@dataclass
class NodeState:
    """One node as the view shows it."""

    index: int
    state: str = STARTING
    pid: int | None = None
    starts: int = 0  # incarnations started (1 + replacements)
    last_exit: int | None = None
    replace_at: float | None = None  # run-clock second the replacement is due (BACKOFF)
    spare: bool = False  # in the spare role (spec.elasticPolicy.spareReplicas): waits outside the group


@dataclass
class RunState:
    """The run as the view shows it."""

    job: str
    nodes: dict[int, NodeState]
    phase: str = "Pending"
    world_size: int | None = None
    epoch: int | None = None
    step: int | None = None
    loss: float | None = None
    samples_per_s: float | None = None
    torchrun_restarts: int = 0  # trainer starts after the first (whole-group restarts by torchrun)
    incidents: int = 0  # failure incidents counted by the failure policy
    max_incidents: int = 0  # spec.failurePolicy.maxRestarts
    last_snapshot_step: int | None = None
    message: str = ""  # the latest runner decision
    starts_seen: int = 0

    @classmethod
    def new(cls, job: str, replicas: int, max_incidents: int, spares: int = 0) -> RunState:
        """`replicas` nodes that train, then `spares` warm spares (the indices after them)."""
        nodes = {i: NodeState(i, spare=i >= replicas) for i in range(replicas + spares)}
        return cls(job=job, nodes=nodes, max_incidents=max_incidents)


def parse_lines(buffer: str) -> tuple[list[dict[str, Any]], str]:
    """Complete JSON lines of `buffer` as dicts, and the unfinished rest to prepend to the next read.

    A line that is not a JSON object (a crash mid-write) is skipped, as read_metrics does.
    """
    *complete, rest = buffer.split("\n")
    events = []
    for line in complete:
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events, rest


def apply_metric(state: RunState, event: dict[str, Any]) -> str | None:
    """Folds one metrics event into `state`; returns a log line for the notable ones."""
    kind = event.get("event")
    if kind == "start":
        return _on_start(state, event)
    if kind == "step":
        state.epoch, state.step = event.get("epoch"), event.get("step")
        state.loss, state.samples_per_s = event.get("loss"), event.get("samples_per_s")
        state.world_size = event.get("world_size", state.world_size)
        for node in state.nodes.values():
            if node.state == STARTING and node.pid is not None and not node.spare:
                node.state = RUNNING
        return None
    if kind == "snapshot":
        state.last_snapshot_step = event.get("step")
        return None
    if kind == "epoch_end":
        return f"epoch {event.get('epoch')} done at step {event.get('step')}, loss {fmt_number(event.get('loss'))}"
    if kind == "done":
        return f"training done: {event.get('epoch', 0) + 1} epochs, {event.get('step')} steps"
    return None


def _on_start(state: RunState, event: dict[str, Any]) -> str:
    state.starts_seen += 1
    state.torchrun_restarts = state.starts_seen - 1
    state.world_size = event.get("world_size")
    where = f"epoch {event.get('resume_epoch', 0)}, step {event.get('resume_step', 0)}"
    if not event.get("resume_step") and not event.get("resume_epoch"):
        if state.starts_seen > 1:
            return f"training restarted from step 0, no snapshot yet (world size {state.world_size})"
        return f"training started: world size {state.world_size}"
    return f"training resumed from the snapshot at {where} (world size {state.world_size})"


def apply_node_event(state: RunState, event: dict[str, Any]) -> str | None:
    """Folds one runner event (see runner.Journal) into `state`; returns its log line."""
    kind, node = event["event"], state.nodes.get(event.get("node", -1))
    if kind == "started" and node:
        node.spare = bool(event.get("spare"))
        node.state = SPARE if node.spare else STARTING
        node.pid, node.starts, node.replace_at = event.get("pid"), node.starts + 1, None
        role = " as a replacement" if node.starts > 1 else ""
        return f"node {node.index} started (pid {node.pid})" + role + (", a warm spare" if node.spare else "")
    if kind == "promoted" and node:
        node.spare, node.state = False, STARTING  # training once the survivors' next round is complete
        lost = state.nodes.get(event.get("replaces", -1))
        if lost:
            lost.spare = True  # its replacement starts as the new spare
        return event.get("message")
    if kind == "killed" and node:
        return f"node {node.index} killed: SIGKILL to its whole process group ({event.get('why', '')})"
    if kind == "exited" and node:
        node.last_exit, node.pid = event.get("code"), None
        node.state = {"finished": SUCCEEDED, "replace": BACKOFF, "none": STOPPED}.get(event.get("action"), FAILED)
        node.replace_at = event.get("replace_at")
        state.incidents = event.get("incidents", state.incidents)
        state.message = event.get("message", "")
        return event.get("message")
    if kind == "stopped" and node:
        node.state, node.pid = STOPPED, None
        return None
    if kind == "held":
        return event["message"]
    if kind == "group_restart":
        state.message = event["message"]
        return event["message"]
    if kind == "store_started":
        return f"rendezvous store started (pid {event.get('pid')})"
    if kind == "store_exited":
        return event.get("message")
    if kind == "phase":
        state.phase, state.message = event["phase"], event.get("message", state.message)
        return f"job {state.phase.lower()}: {state.message}" if state.message else f"job {state.phase.lower()}"
    return None


def fmt_number(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, (int, float)) else "-"
