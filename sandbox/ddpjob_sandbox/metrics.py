"""Following a training job through the trainer's JSON-lines metrics file.

Progress is observed only through that file (the metrics contract in
``ddpjob_trainer.report.metrics``): tests and benchmarks wait for events with generous
timeouts instead of sleeping fixed times, which keeps them stable on a loaded
two-core machine. Each follower's ``wait`` returns the first matching event
after the previous match, so a scenario reads top to bottom: wait for A, inject
a fault, wait for B. :class:`MetricsWatcher` follows bare torchrun agents,
:class:`JobProgress` a DDPJob in the sandbox (it also reads the job's status).
"""
from __future__ import annotations

import contextlib
import json
import time
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from ddpjob_operator.api import constants as C

if TYPE_CHECKING:
    from ddpjob_sandbox.client import KubeClient
    from ddpjob_sandbox.node import NodeAgent
    from ddpjob_sandbox.torchrun import AgentGroup

Event = dict
Predicate = Callable[[Event], bool]


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


def next_match(events: list[Event], cursor: int, predicate: Predicate) -> tuple[Event | None, int]:
    """The first event at or after `cursor` that matches, and the cursor past it (unchanged: none)."""
    for index in range(cursor, len(events)):
        if predicate(events[index]):
            return events[index], index + 1
    return None, cursor


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
            found, self.cursor = next_match(events, self.cursor, predicate)
            if found is not None:
                return found
            all_exited = self.group is not None and self.group.agents and not self.group.running()
            if time.monotonic() > deadline or all_exited:
                reason = "all agents exited" if all_exited else f"timed out after {timeout} s"
                tail = "\n".join(json.dumps(e) for e in events[-8:])
                logs = self.group.logs() if self.group else ""
                raise AssertionError(f"waiting for {what}: {reason}; last events:\n{tail}\n{logs}")
            time.sleep(0.2)


class JobProgress:
    """Follows one sandboxed job through its metrics file, failing fast when the job fails.

    Each :meth:`wait` returns the first event after the previous match that satisfies the
    predicate, so a scenario reads top to bottom (as :class:`MetricsWatcher`).
    """

    def __init__(self, k8s: KubeClient, agent: NodeAgent, job: str, metrics_path: Path):
        self.k8s = k8s
        self.agent = agent
        self.job = job
        self.metrics_path = Path(metrics_path)
        self.cursor = 0

    def events(self) -> list[dict]:
        return read_events(self.metrics_path)

    def status(self) -> dict:
        return (self.k8s.find("ddpjobs", self.job) or {}).get("status") or {}

    def wait(self, predicate: Callable[[dict], bool], timeout: float, what: str) -> dict:
        deadline = time.monotonic() + timeout
        next_status_check = 0.0
        while True:
            found, self.cursor = next_match(self.events(), self.cursor, predicate)
            if found is not None:
                return found
            failed = False
            if time.monotonic() >= next_status_check:
                failed = self.status().get("phase") == "Failed"
                next_status_check = time.monotonic() + 1.0
            if failed or time.monotonic() > deadline:
                self.fail(f"waiting for {what}: " + ("the job failed" if failed else f"timed out after {timeout} s"))
            time.sleep(0.1)

    def wait_phase(self, phase: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = self.status()
            if status.get("phase") == phase:
                return status
            if status.get("phase") in ("Succeeded", "Failed"):
                break
            time.sleep(0.2)
        self.fail(f"waiting for phase {phase} within {timeout} s")

    def fail(self, message: str) -> None:
        tail = "\n".join(json.dumps(e) for e in self.events()[-8:])
        raise AssertionError(f"{message}\njob status: {json.dumps(self.status(), indent=1)}\n"
                             f"last metrics:\n{tail}\ncontainers:\n{self.agent.logs()}")


def trains(k8s: "KubeClient", pod_name: str) -> bool:
    """Whether node pod ``pod_name`` trains: its worker serves the progress record. A warm spare's
    agent has no worker, so nothing listens on its progress port: this tells the spare among the
    node pods, which the rendezvous (not the pod index) chose."""
    pod = k8s.find("pods", pod_name)
    ip = ((pod or {}).get("status") or {}).get("podIP")
    if not ip:
        return False
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    url = f"http://{ip}:{env[C.ENV_PROGRESS_PORT]}/progress"
    with contextlib.suppress(OSError, ValueError):
        with urllib.request.urlopen(url, timeout=2) as answer:
            return json.loads(answer.read()).get("pod") in (None, pod_name)
    return False


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
