"""A local node's processes: start its torchrun agent, kill or stop everything it started.

torchrun starts each worker in a new session (its own process group), so
signalling the agent's group does not reach the workers, and killing only the
agent orphans them. Every process of a node therefore carries a marker in its
environment (inherited by workers and their children); the node's process
tree is the agent's group plus every process with that marker.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import socket
import stat
import subprocess
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from ddpjob_rdzv import contract
from ddpjob_rdzv.contract.fast_tier import FAST_ROOT_ENV, fast_tier_dir

from ddpjob_operator.api import constants as C

from .plan import LocalNode
from .policy import container_exit_code

MARKER_ENV = "DDPJOB_LOCAL_NODE"  # marks every process of one incarnation of a local node
RESTART_COUNT_ENV = "TORCHELASTIC_RESTART_COUNT"  # torchrun sets it in each worker: its restarts so far
STOP_GRACE_SECONDS = 5.0  # SIGTERM, then SIGKILL after this long (torchrun forwards SIGTERM to workers)
KILL_WAIT_SECONDS = 10.0  # how long kill() waits for every marked process to be gone


def port_in_use(host: str, port: int) -> bool:
    """Whether something already listens on host:port (binding it fails with EADDRINUSE)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT leftovers are not "busy"
        try:
            sock.bind((host, port))
        except OSError as e:
            return e.errno == errno.EADDRINUSE
    return False


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on `host` a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class MarkedProcess:
    """A live process found by its environment marker."""

    pid: int
    ppid: int
    env: dict[str, str]


def marked_processes(marker: str, *, key: str = MARKER_ENV, prefix: bool = False) -> list[MarkedProcess]:
    """Live processes (not zombies) whose environment has key=marker (with prefix: key=marker...).

    The one /proc scanner of the project: `ddpjob run` finds a node's orphaned workers with
    it, and the test sandbox (ddpjob_sandbox.procs) a pod's or an agent's.
    """
    needle = f"{key}={marker}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            process = _marked_process(int(entry), needle, prefix)
            if process is not None:
                found.append(process)
    return found


def _marked_process(pid: int, needle: bytes, prefix: bool) -> MarkedProcess | None:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        if needle not in environ and not (prefix and any(item.startswith(needle) for item in environ)):
            return None
        # The command name in stat may hold spaces and parentheses; the fields after the last ")" are fixed.
        state, ppid = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[:2]
    except (OSError, ValueError):  # gone meanwhile, or not ours
        return None
    if state == "Z":
        return None
    env = dict(item.decode(errors="replace").partition("=")[::2] for item in environ if item)
    return MarkedProcess(pid, int(ppid), env)


def marked_pids(marker: str, *, key: str = MARKER_ENV, prefix: bool = False) -> list[int]:
    """The pids of marked_processes(marker, key=key, prefix=prefix)."""
    return [process.pid for process in marked_processes(marker, key=key, prefix=prefix)]


def kill_marked_until_gone(marker: str, *, key: str = MARKER_ENV, prefix: bool = False,
                           timeout: float = KILL_WAIT_SECONDS) -> list[int]:
    """SIGKILLs every process marked key=marker (with prefix: key=marker...), and the groups they
    lead, until none is alive.

    Rescans after each round: a process forked between a scan and the signal carries the
    marker too and is caught by the next scan. Returns the pids still alive at the timeout.
    """
    deadline = time.monotonic() + timeout
    while True:
        pids = marked_pids(marker, key=key, prefix=prefix)
        if not pids or time.monotonic() >= deadline:
            return pids
        signal_all(pids, signal.SIGKILL)
        time.sleep(0.02)


def signal_all(pids: list[int], sig: int) -> None:
    """Sends `sig` to each process and to the group it leads (torchrun workers lead their own)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


@dataclass
class NodeProcess:
    """One incarnation of a local node: the torchrun agent and everything it started."""

    index: int
    process: subprocess.Popen
    marker: str
    log_path: Path
    started_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
    started_mono: float = field(default_factory=time.monotonic)

    @classmethod
    def start(cls, node: LocalNode, base_env: dict[str, str], log_path: Path, marker: str,
              cwd: Path | None = None) -> NodeProcess:
        """Starts node's agent as the leader of a new session, output appended to log_path."""
        env = {**base_env, **node.env, MARKER_ENV: marker}
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            process = subprocess.Popen(node.argv, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, start_new_session=True)
        return cls(node.index, process, marker, log_path)

    @property
    def pid(self) -> int:
        return self.process.pid

    def worker_restarts(self) -> int | None:
        """How often torchrun restarted this node's workers: the highest TORCHELASTIC_RESTART_COUNT
        among its live workers (one /proc scan); None while no worker runs."""
        counts = [int(p.env[RESTART_COUNT_ENV]) for p in marked_processes(self.marker)
                  if p.env.get(RESTART_COUNT_ENV, "").isdigit()]
        return max(counts) if counts else None

    def poll(self) -> int | None:
        """The agent's exit code in the container convention (137 = SIGKILL), None while it runs."""
        code = self.process.poll()
        return None if code is None else container_exit_code(code)

    def kill(self) -> None:
        """SIGKILL the whole node at once, as when its machine dies: agent group, then workers.

        Returns once no process of the node is left (or after KILL_WAIT_SECONDS): a worker the
        agent forked after a scan, or one still dying, would otherwise go on writing into the
        run's snapshot directory after the run ended (bench.local_run failed removing it).
        """
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        kill_marked_until_gone(self.marker)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=KILL_WAIT_SECONDS)

    def terminate(self) -> None:
        """SIGTERM the agent's group: torchrun then stops its workers itself."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGTERM)

    def leftovers(self) -> list[int]:
        """Processes of this node still alive (orphaned workers after the agent died)."""
        return marked_pids(self.marker)


def stop_all(nodes: list[NodeProcess], grace: float = STOP_GRACE_SECONDS) -> None:
    """Stops every node: SIGTERM all at once, SIGKILL whatever is left after `grace` seconds."""
    for node in nodes:
        node.terminate()
    deadline = time.monotonic() + grace
    for node in nodes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            node.process.wait(timeout=max(0.05, deadline - time.monotonic()))
    while time.monotonic() < deadline and any(node.leftovers() for node in nodes):
        time.sleep(0.1)
    for node in nodes:
        node.kill()


def remove_fast_tier_dirs(nodes: list[LocalNode]) -> None:
    """Removes the nodes' fast snapshot tier directories (ddpjob_rdzv.contract.fast_tier) once every
    process of the run is gone. The trainer removes its own when training finishes; a node killed,
    a failed or an interrupted run leaves its copies, twice the training state per worker, in
    /dev/shm: memory nothing else frees on this machine (in a pod it goes with the pod). Nothing
    resumes from them: a new run has a new snapshot directory. Only a directory of this user, not
    a link, as for the fork server's."""
    for node in nodes:
        snapshot_dir, index = node.env.get(contract.SNAPSHOT_DIR_ENV), node.env.get(contract.NODE_INDEX_ENV)
        if not snapshot_dir or index is None:
            continue
        directory = fast_tier_dir(snapshot_dir, index, node.env.get(FAST_ROOT_ENV))
        with contextlib.suppress(OSError):
            info = os.lstat(directory)
            if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid():
                shutil.rmtree(directory)


def remove_fork_server_dirs(nodes: list[LocalNode]) -> None:
    """Removes the nodes' fork server directories (fastRestart) once every process of the run is
    gone: a killed server leaves its socket, and each run would leave a directory per node in
    the runtime directory. Only a directory of this user, not a link: in the temporary
    directory another user may have put something there first (the server refused it).
    """
    for node in nodes:
        socket_path = node.env.get(C.ENV_ZYGOTE_SOCKET)
        if not socket_path:
            continue
        directory = os.path.dirname(socket_path)
        with contextlib.suppress(OSError):
            info = os.lstat(directory)
            if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid():
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(socket_path)
                os.rmdir(directory)
