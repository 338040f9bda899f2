"""Real torchrun agents on loopback for elastic tests and benchmarks.

Each agent is started as the leader of its own process group with a marker
in its environment. torchrun starts every worker in a new session, so the
agent's group does not reach them; the marker (inherited by the workers)
is how :meth:`Agent.kill` and :meth:`Agent.stop` find them again, even
after the agent itself is gone and the workers were orphaned.

Progress is observed only through the trainer's JSON-lines metrics file
(see the metrics contract in ``ddpjob_trainer.metrics``): tests wait for
events with generous timeouts instead of sleeping fixed times, which keeps
them stable on a loaded two-core machine.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from tests.support.procs import free_port, kill_process_group, start_in_own_group, stop_process_group

# Environment variable that marks every process of one agent (agent and workers).
MARKER_ENV = "DDPJOB_TEST_AGENT"

# Rendezvous timeouts that make an elastic event cost ~7-15 s instead of ~45 s
# (the defaults wait 30 s in last call and 15 s to notice a dead node).
FAST_RDZV_CONF = {
    "last_call_timeout": 3,
    "keep_alive_interval": 2,
    "keep_alive_max_attempt": 3,
    "join_timeout": 60,
}

# Without it gloo worker restarts failed or hung in 4 of 6 runs on this machine:
# workers then get a fresh TCP store per round instead of reusing the agent's.
BASE_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "PYTHONUNBUFFERED": "1"}

Event = dict
Predicate = Callable[[Event], bool]


@dataclass(frozen=True)
class Rendezvous:
    """The torchrun rendezvous settings shared by every agent of one job."""

    backend: str
    endpoint: str
    run_id: str
    nnodes: str = "1:3"
    conf: dict = field(default_factory=lambda: dict(FAST_RDZV_CONF))

    @classmethod
    def c10d(cls, nnodes: str = "1:3", **conf) -> "Rendezvous":
        """A c10d rendezvous on a free loopback port with a unique run id."""
        return cls("c10d", f"127.0.0.1:{free_port()}", unique_run_id(), nnodes, {**FAST_RDZV_CONF, **conf})

    def conf_string(self, extra: dict | None = None) -> str:
        merged = {**self.conf, **(extra or {})}
        return ",".join(f"{key}={_conf_value(value)}" for key, value in merged.items())


def unique_run_id() -> str:
    """A fresh rendezvous id: reusing the id of a finished job fails the rendezvous."""
    return f"test-{uuid.uuid4().hex[:12]}"


def _conf_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def torchrun_command(
    rdzv: Rendezvous,
    target: list[str],
    *,
    nproc_per_node: int = 1,
    max_restarts: int = 3,
    rdzv_conf_extra: dict | None = None,
) -> list[str]:
    """The torchrun command line for one agent.

    Args:
        rdzv: the job's rendezvous settings.
        target: ``["-m", MODULE, *args]`` or ``[SCRIPT, *args]``.
        nproc_per_node: workers per agent.
        max_restarts: worker-group restarts the agent allows after failures.
        rdzv_conf_extra: per-agent rendezvous options (``is_host`` for c10d).
    """
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nnodes={rdzv.nnodes}",
        f"--nproc_per_node={nproc_per_node}",
        f"--rdzv_backend={rdzv.backend}",
        f"--rdzv_endpoint={rdzv.endpoint}",
        f"--rdzv_id={rdzv.run_id}",
        f"--rdzv_conf={rdzv.conf_string(rdzv_conf_extra)}",
        f"--max_restarts={max_restarts}",
        *target,
    ]


def marked_processes(marker: str) -> dict[int, dict[str, str]]:
    """Processes whose environment carries ``MARKER_ENV=marker``: pid -> (ppid, RANK...)."""
    found = {}
    needle = f"{MARKER_ENV}={marker}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if needle not in environ:
            continue
        # The command name in stat may contain spaces; fields after ")" are fixed.
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] == "Z":
            continue
        info = {"ppid": fields[1]}
        for item in environ:
            key, _, value = item.decode(errors="replace").partition("=")
            if key in ("RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT"):
                info[key] = value
        found[int(entry)] = info
    return found


def _kill_all(pids: Iterable[int]) -> None:
    """SIGKILLs each process and the group it leads (workers lead their own sessions)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@dataclass
class Agent:
    """One torchrun agent (a "node") and the workers it started."""

    name: str
    process: subprocess.Popen
    log_path: Path
    marker: str
    started_at: float = field(default_factory=time.monotonic)

    @property
    def pid(self) -> int:
        return self.process.pid

    def poll(self) -> int | None:
        return self.process.poll()

    def workers(self) -> dict[int, dict[str, str]]:
        """Live workers of this agent: pid -> env facts (RANK, LOCAL_RANK, ...)."""
        return {pid: info for pid, info in marked_processes(self.marker).items() if info["ppid"] == str(self.pid)}

    def wait_for_workers(self, count: int = 1, timeout: float = 60.0) -> dict[int, dict[str, str]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            workers = self.workers()
            if len(workers) >= count:
                return workers
            if self.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(
            f"agent {self.name} has {len(self.workers())} workers, expected {count} within {timeout} s "
            f"(agent exit code {self.poll()}); log tail:\n{self.log_tail()}"
        )

    def kill_worker(self, sig: int = signal.SIGKILL, rank: int | None = None) -> int:
        """Kills one worker of this agent (global ``rank`` if given); returns its pid."""
        workers = self.wait_for_workers()
        chosen = [pid for pid, info in workers.items() if rank is None or info.get("RANK") == str(rank)]
        if not chosen:
            raise AssertionError(f"agent {self.name} has no worker with RANK={rank}: {workers}")
        os.kill(chosen[0], sig)
        return chosen[0]

    def kill(self) -> None:
        """Simulates the death of this node: SIGKILL the agent's group, then its workers' groups."""
        workers = marked_processes(self.marker)
        kill_process_group(self.process, signal.SIGKILL)
        _kill_all(workers)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)

    def wait(self, timeout: float) -> int:
        """Waits for the agent to exit; returns its exit code."""
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"agent {self.name} still running after {timeout} s; log tail:\n{self.log_tail()}"
            ) from None

    def stop(self) -> None:
        """Stops the agent gracefully if it still runs, then kills anything left with its marker."""
        stop_process_group(self.process)
        _kill_all(marked_processes(self.marker))

    def log_tail(self, chars: int = 3000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-chars:]
        return "<no log>"


class AgentGroup:
    """Starts agents of one job and always stops all of them (a context manager).

    Args:
        workdir: where agent logs go.
        rdzv: the job's rendezvous settings.
        target: ``["-m", MODULE, *args]`` or ``[SCRIPT, *args]`` run by every worker.
        env: extra environment for every agent (and so its workers).
        max_restarts: torchrun ``--max_restarts``.
    """

    def __init__(self, workdir: Path, rdzv: Rendezvous, target: list[str], env: dict | None = None,
                 max_restarts: int = 3, nproc_per_node: int = 1):
        self.workdir = Path(workdir)
        self.rdzv = rdzv
        self.target = target
        self.env = {**BASE_ENV, **(env or {})}
        self.max_restarts = max_restarts
        self.nproc_per_node = nproc_per_node
        self.agents: list[Agent] = []

    def start(self, name: str | None = None, rdzv_conf_extra: dict | None = None) -> Agent:
        name = name or f"agent{len(self.agents)}"
        marker = f"{name}-{uuid.uuid4().hex[:8]}"
        log_path = self.workdir / f"{name}.log"
        command = torchrun_command(self.rdzv, self.target, nproc_per_node=self.nproc_per_node,
                                   max_restarts=self.max_restarts, rdzv_conf_extra=rdzv_conf_extra)
        env = {**os.environ, **self.env, MARKER_ENV: marker}
        with open(log_path, "ab") as log:
            process = start_in_own_group(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)
        agent = Agent(name, process, log_path, marker)
        self.agents.append(agent)
        return agent

    def running(self) -> list[Agent]:
        return [agent for agent in self.agents if agent.poll() is None]

    def logs(self, chars: int = 2500) -> str:
        return "\n".join(f"--- {a.name} (exit {a.poll()}) ---\n{a.log_tail(chars)}" for a in self.agents)

    def wait_all(self, timeout: float) -> dict[str, int]:
        """Waits until every agent has exited; returns name -> exit code."""
        deadline = time.monotonic() + timeout
        for agent in self.agents:
            remaining = max(0.1, deadline - time.monotonic())
            try:
                agent.process.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"agents still running after {timeout} s:\n{self.logs()}") from None
        return {agent.name: agent.poll() for agent in self.agents}

    def stop(self) -> None:
        for agent in self.agents:
            agent.stop()

    def __enter__(self) -> "AgentGroup":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def read_events(path: Path) -> list[Event]:
    """Every complete JSON line of a metrics file (a line still being written is skipped)."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return []
    events = []
    for line in text.splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            events.append(json.loads(line))
    return events


class MetricsWatcher:
    """Follows a metrics file and waits for events, in order, with a cursor.

    Each :meth:`wait` returns the first matching event after the previous
    match, so a scenario reads top to bottom: wait for A, inject a fault,
    wait for B.
    """

    def __init__(self, path: Path, group: AgentGroup | None = None):
        self.path = Path(path)
        self.group = group
        self.cursor = 0

    def events(self) -> list[Event]:
        return read_events(self.path)

    def wait(self, predicate: Predicate, timeout: float, what: str) -> Event:
        """Waits up to ``timeout`` s for an event matching ``predicate``; fails fast if all agents exited."""
        deadline = time.monotonic() + timeout
        while True:
            events = self.events()
            for index in range(self.cursor, len(events)):
                if predicate(events[index]):
                    self.cursor = index + 1
                    return events[index]
            all_exited = self.group is not None and self.group.agents and not self.group.running()
            if time.monotonic() > deadline or all_exited:
                reason = "all agents exited" if all_exited else f"timed out after {timeout} s"
                tail = "\n".join(json.dumps(e) for e in events[-8:])
                logs = self.group.logs() if self.group else ""
                raise AssertionError(f"waiting for {what}: {reason}; last events:\n{tail}\n{logs}")
            time.sleep(0.2)


def is_event(kind: str, **fields) -> Predicate:
    """A predicate: event type ``kind`` whose fields equal ``fields`` (callables are tests)."""

    def matches(event: Event) -> bool:
        if event.get("event") != kind:
            return False
        for key, expected in fields.items():
            value = event.get(key)
            if callable(expected):
                if value is None or not expected(value):
                    return False
            elif value != expected:
                return False
        return True

    return matches


def effective_history(events: Iterable[Event], kinds: tuple[str, ...] = ("step", "epoch_end")) -> list[Event]:
    """The history that counts, computed independently of the trainer's own reader.

    A ``start`` event that resumes from step S discards every event of
    ``kinds`` after step S recorded before it (work lost with the crashed
    run, to be done again); what is left is the job's effective history.
    """
    history: list[Event] = []
    for event in events:
        if event.get("event") == "start":
            resume = int(event.get("resume_step") or 0)
            history = [kept for kept in history if kept["step"] <= resume]
        elif event.get("event") in kinds:
            history.append(event)
    return history
