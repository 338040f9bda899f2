"""Processes of the sandbox: start one as a new session, find a tree by its marker, kill it whole.

torchrun's workers run in sessions of their own, so killing only an agent orphans them and
signalling the agent's group does not reach them. Every process here starts a new session
and carries a marker in its environment (inherited by whatever it starts); a "node" or a
"container" is stopped as its group plus every marked process, which is also how tests and
benchmarks play the death of a node.

The /proc scanner and the port helper are ``ddpjob run``'s own (ddpjob_operator.local.procs):
one implementation for the product and its test machinery.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

from ddpjob_operator.local.procs import free_port, kill_marked_until_gone, marked_pids, marked_processes, signal_all

__all__ = ["free_port", "holds_socket", "kill_marked", "kill_marked_until_gone", "kill_process_group", "listening_socket_inodes",
           "marked_pids", "marked_processes", "signal_all", "start_in_own_group", "stop_process_group"]


def start_in_own_group(args, **kwargs) -> subprocess.Popen:
    """Starts ``args`` as the leader of a new process group (and session)."""
    return subprocess.Popen(args, start_new_session=True, **kwargs)


def kill_process_group(process: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    """Sends ``sig`` to the whole group that ``process`` leads (a node's death)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)


def stop_process_group(process: subprocess.Popen, grace: float = 5.0) -> None:
    """SIGTERM the group, then SIGKILL it after ``grace`` seconds; reaps the leader."""
    if process.poll() is None:
        kill_process_group(process, signal.SIGTERM)
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    kill_process_group(process, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=grace)


def kill_marked(key: str, value: str, sig: int = signal.SIGKILL) -> list[int]:
    """Signals every process whose environment has ``key=value``, and the group each leads."""
    pids = marked_pids(value, key=key)
    signal_all(pids, sig)
    return pids


def listening_socket_inodes(port: int) -> set[str]:
    """Socket inodes listening on TCP ``port`` (IPv4 or IPv6), from /proc/net."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:  # 0A = LISTEN
                    inodes.add(inode)
    return inodes


def holds_socket(pid: int, inodes: set[str]) -> bool:
    """Whether process ``pid`` has one of the sockets ``inodes`` open (who listens on a port)."""
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    return True
    return False
