"""The files a local run appends to and follows: its events.jsonl and the trainer's metrics."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from .state import parse_lines


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
