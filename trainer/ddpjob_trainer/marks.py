"""Start-up marks of a worker, for the recovery benchmark (bench/recovery.py); off unless asked.

With ``DDPJOB_RECOVERY_MARKS=<file>`` in its environment a worker appends one JSON line per
mark to that file: ``{"mark", "time" (seconds since the epoch), "pid", "rank"}``. The marks
split a restart into process start (from /proc, so it costs the worker nothing), imports
done (torch loaded) and process group up; the trainer's own metrics give the snapshot
load ("start") and the first step. Unset (the default), ``mark`` is one dictionary lookup.
"""
from __future__ import annotations

import json
import os
import time

from ddpjob_rdzv.process_start import process_start_time

MARKS_ENV = "DDPJOB_RECOVERY_MARKS"


def mark(name: str, at: float | None = None) -> None:
    """Appends mark ``name`` (at ``at``, default now) when DDPJOB_RECOVERY_MARKS names a file."""
    path = os.environ.get(MARKS_ENV)
    if not path:
        return
    line = json.dumps({"mark": name, "time": time.time() if at is None else at, "pid": os.getpid(),
                       "rank": os.environ.get("RANK")}) + "\n"
    # One write of a short line with O_APPEND: concurrent workers' lines do not interleave.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def mark_imports_done() -> None:
    """The worker's process start and the end of its heavy imports (called where torch was imported)."""
    if os.environ.get(MARKS_ENV):
        mark("process_started", process_start_time())
        mark("imports_done")
