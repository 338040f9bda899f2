"""Real torchrun agents on loopback for elastic tests and benchmarks.

Each agent is started as the leader of its own process group with a marker
in its environment. torchrun starts every worker in a new session, so the
agent's group does not reach them; the marker (inherited by the workers)
is how :meth:`Agent.kill` and :meth:`Agent.stop` find them again, even
after the agent itself is gone and the workers were orphaned.

Progress is observed only through the trainer's JSON-lines metrics file
(ddpjob_sandbox.metrics.MetricsWatcher, given an AgentGroup to fail fast).
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from ddpjob_sandbox.procs import (
    free_port, kill_marked_until_gone, kill_process_group, marked_processes, start_in_own_group, stop_process_group,
)

# Environment variable that marks every process of one agent (agent and workers).
MARKER_ENV = "DDPJOB_TEST_AGENT"
# What Agent.workers tells of each worker (torchrun sets them).
WORKER_FACTS = ("RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT")

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
        return {p.pid: {k: v for k, v in p.env.items() if k in WORKER_FACTS}
                for p in marked_processes(self.marker, key=MARKER_ENV) if p.ppid == self.pid}

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
        """Simulates the death of this node: SIGKILL the agent's group, then its workers' groups,
        until none is left (a worker forked meanwhile, or one still dying, would write on)."""
        kill_process_group(self.process, signal.SIGKILL)
        kill_marked_until_gone(self.marker, key=MARKER_ENV)
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
        kill_marked_until_gone(self.marker, key=MARKER_ENV)

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


def example_target(workdir: Path, *, epochs: int, samples: int, step_sleep: float, batch_size: int = 32) -> list[str]:
    """torchrun target running the example with snapshots every epoch under ``workdir``."""
    return [
        "-m", "ddpjob_trainer.examples.mlp",
        "--epochs", str(epochs),
        "--samples", str(samples),
        "--batch-size", str(batch_size),
        "--snapshot-dir", str(workdir / "snapshots"),
        "--snapshot-every-epochs", "1",
        "--metrics-file", str(workdir / "metrics.jsonl"),
        "--step-sleep", str(step_sleep),
        "--val-samples", "0",
        "--no-progress-bar",
    ]
