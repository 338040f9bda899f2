"""What the recovery benchmarks read from the trainer's metrics, and how they stop a `ddpjob run`
(one definition for all of them)."""
from __future__ import annotations

import contextlib
import datetime
import json
import os
import signal
import subprocess
import time
from pathlib import Path

from ddpjob_operator.local.procs import kill_marked_until_gone
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


def interrupt_ddpjob_run(proc: subprocess.Popen, run_dir: Path, timeout: float) -> bool:
    """Ctrl-C (SIGINT) to a `ddpjob run` started in its own session: whether it stopped within
    ``timeout`` s. If not, it is SIGKILLed with every process of its nodes: they run in sessions
    of their own, so killing ddpjob's group alone would leave them training into ``run_dir``."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=timeout)
        return True
    except subprocess.TimeoutExpired:
        pass
    os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):  # reaped, unless stuck in the kernel: no wait without limit
        proc.wait(timeout=10)
    try:  # every incarnation's marker starts with the run's rendezvous id (ddpjob_operator.local.runner)
        rdzv_id = json.loads((run_dir / "launch.json").read_text())["rdzv_id"]
    except FileNotFoundError:
        return False  # stuck before it wrote its launch: no node was started
    kill_marked_until_gone(f"{rdzv_id}.", prefix=True)
    return False
