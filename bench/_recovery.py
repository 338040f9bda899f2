"""What the recovery benchmarks read from the trainer's metrics (one definition for all of them)."""
from __future__ import annotations

import datetime
import time
from pathlib import Path

from ddpjob_sandbox.metrics import read_events

EVENT_TIMEOUT = 120.0


def event_time(event: dict) -> float:
    """Wall time (seconds since the epoch) of a metrics or events.jsonl record."""
    return datetime.datetime.fromisoformat(event["time"].replace("Z", "+00:00")).timestamp()


def first_step_after(metrics: Path, killed_at: float, world_size: int | None = None) -> dict | None:
    """The first step (of ``world_size`` if given) after a trainer start that came after the kill:
    the moment training resumed, not a step the survivors logged before they noticed."""
    restarted = False
    for event in read_events(metrics):
        if event_time(event) <= killed_at:
            continue
        restarted = restarted or event["event"] == "start"
        if restarted and event["event"] == "step" and world_size in (None, event["world_size"]):
            return event
    return None


def wait_for(condition, what: str, timeout: float = EVENT_TIMEOUT):
    """The first truthy value of ``condition()``, polled every 0.1 s; TimeoutError naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise TimeoutError(f"waiting for {what}: timed out after {timeout} s")
