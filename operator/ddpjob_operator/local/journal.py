"""The files of a local run: events.jsonl it appends to, the trainer's metrics it follows, and
the timeline (timeline.json, and its picture timeline.svg with the [plot] extra) it writes at the end."""

from __future__ import annotations

import importlib.util
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from .state import parse_lines
from .timeline import build_timeline

TIMELINE_JSON = "timeline.json"
TIMELINE_PICTURE = "timeline.svg"  # SVG: its labels stay text (searchable), it scales, it is small
PLOT_HINT = "pip install 'ddpjob-operator[plot]'"  # the extra that brings matplotlib


class Journal:
    """events.jsonl: the runner's events with wall time and run clock."""

    def __init__(self, path: Path, clock: Callable[[], float]):
        self.path, self.clock = path, clock
        self._handle = open(path, "a", encoding="utf-8")

    def write(self, event: str, **fields: Any) -> dict[str, Any]:
        record = {"time": datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                  "t": round(self.clock(), 3), "event": event, **fields}
        self._handle.write(json.dumps(record) + "\n")
        self._handle.flush()
        return record

    def close(self) -> None:
        self._handle.close()


class MetricsFollower:
    """Reads the lines appended to the metrics file since the last call."""

    def __init__(self, path: Path):
        # Start at the end: in a reused run directory the earlier runs' lines are history,
        # not news (the summary still reads the whole file).
        self.path, self.rest = path, ""
        self.offset = path.stat().st_size if path.exists() else 0

    def new_events(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, encoding="utf-8", errors="replace") as handle:
                handle.seek(self.offset)
                chunk = handle.read()
                self.offset = handle.tell()
        except FileNotFoundError:
            return []
        events, self.rest = parse_lines(self.rest + chunk)
        return events


def read_json_lines(path: Path) -> list[dict[str, Any]]:
    """Every complete JSON object line of `path` (none when it does not exist)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    return parse_lines(text + "\n")[0]


def write_timeline(job: str, run_dir: Path, metrics_file: Path) -> list[str]:
    """Writes timeline.json, and timeline.svg when matplotlib is installed; returns the line
    that says where they are (or how to get the picture)."""
    timeline = build_timeline(job, read_json_lines(run_dir / "events.jsonl"), read_json_lines(metrics_file))
    data = run_dir / TIMELINE_JSON
    data.write_text(timeline.to_json(), encoding="utf-8")
    if importlib.util.find_spec("matplotlib") is None:  # the optional [plot] extra
        return [f"timeline data: {data}; for the picture, {PLOT_HINT}"]
    from .timeline_plot import draw  # here: matplotlib takes a second to import

    picture = draw(timeline, run_dir / TIMELINE_PICTURE)
    return [f"timeline: {picture} (data: {data.name})"]
