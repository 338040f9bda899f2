"""Process helpers for tests that start real torchrun agents and servers.

torchrun's workers run in their own session, so killing only an agent
orphans them; every process here starts a new session and is stopped as a
whole process group, which is also how tests simulate the death of a node.
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess


def free_port() -> int:
    """A TCP port that was free on loopback a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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
