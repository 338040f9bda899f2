"""A container on this machine: one pod's process tree, stopped as a whole, with its exit code,
termination message and log.

The tree is a new session (setsid) whose every process, torchrun's workers included (they
start sessions of their own), carries the pod's marker (launch.POD_ENV) in its environment.
The container "dies" as a whole: when its main process exits, or is killed, whatever is left
is killed, and SIGKILL reads as exit code 137 (128 + 9), as from a runtime.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import time
from pathlib import Path

from ddpjob_operator.local.policy import container_exit_code

from ddpjob_sandbox.node.launch import POD_ENV
from ddpjob_sandbox.pod_status import LOOPBACK, now_rfc3339
from ddpjob_sandbox.procs import kill_marked, marked_pids

MESSAGE_BYTES = 4096  # the kubelet keeps at most this much of a termination message
FALLBACK_LOG_LINES, FALLBACK_LOG_BYTES = 80, 2048  # FallbackToLogsOnError: the log's tail, capped


@dataclasses.dataclass
class PodProcess:
    """A running (or finished) container: one pod's process tree."""

    namespace: str
    name: str
    uid: str
    process: subprocess.Popen
    log_path: Path
    started_at: str
    grace_seconds: float
    exit_code: int | None = None
    finished_at: str | None = None
    term_sent_at: float | None = None  # monotonic time of the SIGTERM of a graceful deletion
    reported: bool = False  # the terminated status was written
    termination_log: Path | None = None  # the file the kubelet would copy into terminated.message
    fallback_to_logs: bool = False  # terminationMessagePolicy FallbackToLogsOnError
    pod_ip: str = LOOPBACK  # the address the pod's listeners bind (node.network)
    started_monotonic: float = dataclasses.field(default_factory=time.monotonic)  # how long it ran: the back-off

    def pids(self) -> list[int]:
        return marked_pids(self.uid, key=POD_ENV)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signals the whole container: the main process group, then every marked process."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, sig)
        kill_marked(POD_ENV, self.uid, sig)

    def poll(self) -> int | None:
        """The exit code once the main process exited; then nothing of the container is left alive."""
        if self.exit_code is None and self.process.poll() is not None:
            kill_marked(POD_ENV, self.uid)  # the container goes with its main process
            self.exit_code = container_exit_code(self.process.returncode)
            self.finished_at = now_rfc3339()
        return self.exit_code

    def terminate(self) -> None:
        """Graceful stop step: SIGTERM the main process once, SIGKILL all after the grace period."""
        if self.poll() is not None:
            return
        if self.term_sent_at is None:
            self.term_sent_at = time.monotonic()
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGTERM)
        elif time.monotonic() - self.term_sent_at >= self.grace_seconds:
            self.kill()

    def termination_message(self) -> str | None:
        """What a kubelet puts in ``terminated.message``: the file, else (by policy, after a
        failure) the last lines of the log."""
        message = ""
        if self.termination_log is not None:
            with contextlib.suppress(OSError):
                message = self.termination_log.read_bytes()[:MESSAGE_BYTES].decode(errors="replace").strip()
        if not message and self.fallback_to_logs and self.exit_code:
            tail = "\n".join(self.log(chars=64 * 1024).splitlines()[-FALLBACK_LOG_LINES:])
            message = tail.encode()[-FALLBACK_LOG_BYTES:].decode(errors="replace").strip()
        return message or None

    def log(self, chars: int = 4000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-chars:]
        return ""


class ContainerReader:
    """What a test does with the containers a node runs, for any reader that knows a pod's newest
    container (``current``) and can say what went wrong (``diagnosis``): one node agent, or every
    kubelet of a namespace (control_plane.kubelets.Containers)."""

    def current(self, name: str) -> "PodProcess | None":
        raise NotImplementedError

    def diagnosis(self) -> str:
        raise NotImplementedError

    def wait_for_container(self, name: str, timeout: float = 30, *, other_than: str | None = None) -> "PodProcess":
        """Waits until a container of pod ``name`` (with a uid other than ``other_than``) was started."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            container = self.current(name)
            if container is not None and container.uid != other_than:
                return container
            time.sleep(0.05)
        raise AssertionError(f"no container of pod {name} (other than uid {other_than}) started within {timeout} s; "
                             f"{self.diagnosis()}")

    def kill(self, name: str, sig: int = signal.SIGKILL) -> "PodProcess":
        """Kills every process of pod ``name``'s running container (a node or OOM kill); returns it."""
        container = self.current(name)
        if container is None or container.process.poll() is not None:
            raise AssertionError(f"pod {name} has no running container to kill: {container}")
        container.kill(sig)
        return container
