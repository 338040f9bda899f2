"""When a process started, from /proc (Linux): for the operator's peering priority and the
recovery benchmark's marks. Reading it costs the process nothing at start-up, and it does not
depend on how long the process then took to import its modules."""
from __future__ import annotations

import os
import time


def _ticks_since_boot(pid: int | str) -> int:
    # Field 22 of stat counts clock ticks since boot; the command name (field 2) may hold spaces.
    return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[19])


def process_start_time(pid: int | str = "self") -> float:
    """When process ``pid`` started (seconds since the epoch), to the clock tick (10 ms): for
    timing it against ``time.time()``. Two reads may differ by a tick (see stable_start_time)."""
    # Against /proc/uptime (10 ms) rather than btime, which has whole seconds only.
    ticks = _ticks_since_boot(pid)
    now, uptime = time.time(), float(open("/proc/uptime").read().split()[0])
    return now - uptime + ticks / os.sysconf("SC_CLK_TCK")


def stable_start_time(pid: int | str = "self") -> float:
    """When process ``pid`` started (seconds since the epoch), anchored to the boot time's whole
    second: every read gives the same value, and processes of one machine are ordered exactly as
    they started (to the tick), which process_start_time's 10 ms jitter does not promise. Against
    the wall clock it may be up to a second early."""
    boot = next(int(line.split()[1]) for line in open("/proc/stat") if line.startswith("btime "))
    return boot + _ticks_since_boot(pid) / os.sysconf("SC_CLK_TCK")
