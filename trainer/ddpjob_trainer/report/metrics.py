"""Training metrics as JSON lines, written by global rank 0 and read back with rollback.

One file collects every attempt of a job (appended across restarts). Each
line has ``event`` and ``time``; the events are::

    {"event": "start", "world_size": W, "restart_count": R, "resume_epoch": E, "resume_step": S}
    {"event": "step", "epoch": E, "step": GLOBAL_STEP, "loss": L, "samples_per_s": X, "world_size": W}
    {"event": "snapshot", "epoch": E, "step": S, "path": P, "samples_consumed": N}
    {"event": "epoch_end", "epoch": E, "step": S, "loss": L}
    {"event": "validation", "epoch": E, "step": S, "loss": L}
    {"event": "done", "epoch": E, "step": S}

(``snapshot.epoch`` is the epoch training resumes at, as in the snapshot.)

Rollback: when a worker dies, the job restarts from the last complete
snapshot, so steps logged after that snapshot were lost work and are trained
again. They stay in the file (it is an honest log of what ran), and the new
attempt's ``start`` event says where it resumed. ``read_metrics`` applies
that: each ``start`` removes the earlier events past its ``resume_step``, the
epoch-level events of epochs that will run again, and earlier ``done``
events. What remains is the effective history, in which every global step
appears exactly once.

Optional sinks (TensorBoard, Weights & Biases) receive the same scalars; both
are imported only when configured, so neither is a dependency.

Usage::

    events = read_metrics("/snapshots/metrics.jsonl")
    steps = [e["step"] for e in events if e["event"] == "step"]
"""
from __future__ import annotations

import datetime
import json
import logging
import os
import threading
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger(__name__)

_EPOCH_EVENTS = ("epoch_end", "validation")


class Sink(Protocol):
    """Receives every event written to the metrics file."""

    def log(self, event: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


class MetricsWriter:
    """Appends events to ``path`` (when given) and forwards them to ``sinks``.

    Thread-safe: the asynchronous snapshot writer reports from its own thread.
    Construct it with ``path=None`` and no sinks on ranks other than 0.
    """

    def __init__(self, path: str | os.PathLike | None, sinks: list[Sink] | tuple = ()):
        self.path = Path(path) if path else None
        self.sinks = list(sinks)
        self._lock = threading.Lock()
        self._handle = None
        # Opened at the first event, not here: a Job is built before its snapshot is loaded, and a
        # run that fails there (no snapshot readable) has not started training, so leaves no file.
        self._closed = False

    def write(self, event: str, **fields: Any) -> dict[str, Any]:
        """Records one event; returns it as written."""
        record = {"event": event, "time": _now(), **fields}
        with self._lock:
            if self._handle is None and self.path is not None and not self._closed:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._handle = open(self.path, "a", encoding="utf-8")
            if self._handle is not None:
                # One write + flush per line: a crash loses at most the line
                # being written, which read_metrics skips.
                self._handle.write(json.dumps(record) + "\n")
                self._handle.flush()
            for sink in self.sinks:
                sink.log(record)
        return record

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._handle is not None:
                self._handle.close()
                self._handle = None
            for sink in self.sinks:
                sink.close()


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The effective history in ``path``: rolled-back events removed (see module docstring).

    Lines that are not complete JSON objects (a crash mid-write) are skipped.
    """
    history: list[dict[str, Any]] = []
    for event in _parse_lines(Path(path)):
        if event.get("event") == "start":
            history = _roll_back(history, event.get("resume_epoch", 0), event.get("resume_step", 0))
        history.append(event)
    return history


def redone_per_resume(path: str | os.PathLike) -> list[tuple[dict[str, Any], list[int]]]:
    """Each resume in ``path`` (every ``start`` after the first) with the steps it rolled back:
    steps trained before it and trained again after it (the effective history holds each step
    once, so a rolled-back step of a run that went on to finish was trained twice)."""
    history: list[dict[str, Any]] = []
    resumes: list[tuple[dict[str, Any], list[int]]] = []
    for event in _parse_lines(Path(path)):
        if event.get("event") == "start":
            kept = _roll_back(history, event.get("resume_epoch", 0), event.get("resume_step", 0))
            if any(e.get("event") == "start" for e in history):
                still = {id(e) for e in kept}
                resumes.append((event, [e["step"] for e in history if e.get("event") == "step" and id(e) not in still]))
            history = kept
        history.append(event)
    return resumes


def read_raw_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Every event in ``path`` as written, including rolled-back ones."""
    return list(_parse_lines(Path(path)))


def _roll_back(history: list[dict[str, Any]], resume_epoch: int, resume_step: int) -> list[dict[str, Any]]:
    kept = []
    for event in history:
        kind = event.get("event")
        if kind == "done":
            continue
        if kind != "start" and event.get("step", 0) > resume_step:
            continue
        if kind in _EPOCH_EVENTS and event.get("epoch", 0) >= resume_epoch:
            continue
        kept.append(event)
    return kept


def _parse_lines(path: Path):
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                log.warning("metrics file %s line %d is not complete JSON; skipping it", path, number)
                continue
            if isinstance(event, dict):
                yield event


class TensorBoardSink:
    """Writes step/epoch scalars with ``torch.utils.tensorboard`` (needs the tensorboard package)."""

    def __init__(self, log_dir: str):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as error:
            raise RuntimeError(
                f"tensorboard_dir is set ({log_dir!r}) but tensorboard is not installed: "
                "pip install 'ddpjob-trainer[tensorboard]'"
            ) from error
        self._writer = SummaryWriter(log_dir=log_dir)

    def log(self, event: dict[str, Any]) -> None:
        step = event.get("step")
        for name, value in _scalars(event).items():
            self._writer.add_scalar(name, value, global_step=step)

    def close(self) -> None:
        self._writer.close()


class WandbSink:
    """Logs scalars to Weights & Biases, continuing ``run_id`` when the job resumes."""

    def __init__(self, project: str, run_id: str | None, config: dict[str, Any] | None = None):
        try:
            import wandb
        except ImportError as error:
            raise RuntimeError(
                f"wandb_project is set ({project!r}) but wandb is not installed: pip install 'ddpjob-trainer[wandb]'"
            ) from error
        self._wandb = wandb
        # resume="allow" with the id from the snapshot: a restarted job keeps one W&B run.
        self._run = wandb.init(project=project, id=run_id, resume="allow", config=config or {})
        self.run_id = self._run.id

    def log(self, event: dict[str, Any]) -> None:
        scalars = _scalars(event)
        if scalars:
            self._run.log(scalars, step=event.get("step"))

    def close(self) -> None:
        self._run.finish()


def _scalars(event: dict[str, Any]) -> dict[str, float]:
    kind = event.get("event")
    if kind == "step":
        return {"train/loss": event["loss"], "train/samples_per_s": event["samples_per_s"], "train/epoch": event["epoch"]}
    if kind in _EPOCH_EVENTS:
        return {f"{kind}/loss": event["loss"]}
    return {}


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
