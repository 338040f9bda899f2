"""Recovery after losing node 0 under three rendezvous topologies, side by side, on loopback.

Three real torchrun agents train the example model (snapshots every epoch) with
``--nnodes=1:3``; then node 0's whole process group is SIGKILLed, and the operator's
reaction is played, its new pods starting either at once or DELAYED seconds later (in a
cluster a new pod waits for the backoff, the scheduler and the image):

* ``c10d, store on node 0``: node 0 hosted the store, so the rendezvous is gone; the
  operator deletes the survivors and starts all three nodes again under a new rendezvous
  id (a whole-group restart, status.rendezvousGeneration + 1);
* ``c10d, store pod``: a separate process runs the store pod's program (``python -c``) and holds the
  store and every agent is a client (``is_host=false``); only node 0 is started again;
* ``etcd-v3``: the state is in etcd; only node 0 is started again.

Columns (seconds from the kill): ``first step`` is the first optimizer step written
after it (any world size: training going on), ``3 nodes`` the first step with world size
3 again;
``survivors`` says whether nodes 1 and 2 kept their agents; ``redone`` is how many steps
ran again because they were after the last snapshot. One run each (two-core machine:
expect +-3 s); agents use the tests' fast rendezvous timeouts (last call 3 s).
"""
from __future__ import annotations

import datetime
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ddpjob_sandbox.torchrun import example_target, FAST_RDZV_CONF, AgentGroup, Rendezvous, unique_run_id
from ddpjob_operator.render.store_pod import store_command
from ddpjob_sandbox.etcd import running_etcd
from ddpjob_sandbox.procs import free_port, start_in_own_group, stop_process_group
from ddpjob_sandbox.metrics import read_events

TOPOLOGIES = ("c10d, store on node 0", "c10d, store pod", "etcd-v3")
NODES = 3
TIMEOUT = 180.0  # seconds to wait for any one phase before calling the run failed
DELAYS = (0.0, 20.0)  # seconds between the kill and the replacement pods' start


@dataclass
class Recovery:
    first_step: float | None  # seconds from the kill to the first step after it
    full_size: float | None  # ... to the first step with world size NODES
    survivors_kept: bool  # nodes 1..N-1 kept their agents
    redone: int | None  # steps after the last snapshot that ran again


def main() -> None:
    with running_etcd() as etcd, tempfile.TemporaryDirectory(prefix="bench-topology-") as tmp:
        rows = {(name, delay): measure(Path(tmp) / f"run{i}-{delay:.0f}", name, etcd, delay)
                for delay in DELAYS for i, name in enumerate(TOPOLOGIES)}
    print_table(rows)


def measure(run_dir: Path, topology: str, etcd, delay: float) -> Recovery | None:
    run_dir.mkdir(parents=True)
    target = example_target(run_dir, epochs=200, samples=256, step_sleep=0.1)
    metrics = run_dir / "metrics.jsonl"
    store = None
    try:
        if topology == "c10d, store pod":
            store = start_store(run_dir)
        rdzv = rendezvous(topology, etcd, store)
        with AgentGroup(run_dir, rdzv, target) as group:
            start_nodes(group, topology, range(NODES))
            if wait_step(metrics, 0.0, lambda e: e.get("world_size") == NODES and e["epoch"] >= 1) is None:
                print(f"  {topology}: {NODES} nodes never trained past a snapshot\n{group.logs(800)}", file=sys.stderr)
                return None
            killed_at = time.time()
            group.agents[0].kill()
            with react(run_dir, topology, etcd, group, target, delay):
                first = wait_step(metrics, killed_at, lambda e: True)
                full = wait_step(metrics, killed_at, lambda e: e.get("world_size") == NODES)
            survivors_kept = all(agent.poll() is None for agent in group.agents[1:NODES])
    finally:
        if store is not None:
            stop_process_group(store)
    return Recovery(first and first - killed_at, full and full - killed_at, survivors_kept,
                    redone_steps(metrics, killed_at))


def start_store(run_dir: Path) -> subprocess.Popen:
    """The store pod's program on a free port; returns once it listens."""
    port = free_port()
    log = open(run_dir / "store.log", "w")
    process = start_in_own_group([*store_command(sys.executable), "--port", str(port)],
                                 stdout=log, stderr=subprocess.STDOUT)
    log.close()
    deadline = time.monotonic() + 60
    while "listening" not in (run_dir / "store.log").read_text():
        if time.monotonic() > deadline or process.poll() is not None:
            raise RuntimeError(f"the store did not start: {(run_dir / 'store.log').read_text()}")
        time.sleep(0.1)
    process.port = port  # type: ignore[attr-defined]
    return process


def rendezvous(topology: str, etcd, store) -> Rendezvous:
    conf = {**FAST_RDZV_CONF, "join_timeout": 120}
    if topology == "etcd-v3":
        return Rendezvous("etcd-v3", etcd.endpoint, unique_run_id(), f"1:{NODES}", conf)
    port = store.port if store is not None else free_port()
    return Rendezvous("c10d", f"127.0.0.1:{port}", unique_run_id(), f"1:{NODES}", conf)


def start_nodes(group: AgentGroup, topology: str, indexes) -> None:
    for index in indexes:
        extra = None
        if topology.startswith("c10d"):
            # With a store pod no agent hosts the store; otherwise node 0 does (as in a pod).
            extra = {"is_host": topology == "c10d, store on node 0" and index == 0}
        group.start(f"node{index}-{len(group.agents)}", rdzv_conf_extra=extra)


class react:
    """The operator's reaction to losing node 0, its new pods starting `delay` s from now;
    a context manager that stops what it started."""

    def __init__(self, run_dir: Path, topology: str, etcd, group: AgentGroup, target: list[str], delay: float):
        if topology == "c10d, store on node 0":
            for agent in group.agents[1:]:
                agent.kill()  # the operator deletes the survivors at once instead of waiting for them to exit
            # A new generation: a new rendezvous id (and here a new port for the new node 0).
            self.group, indexes = AgentGroup(run_dir, rendezvous(topology, etcd, None), target), range(NODES)
        else:
            self.group, indexes = group, [0]  # node 0 alone, joining the running rendezvous
        self.owned = self.group is not group
        self.timer = threading.Timer(delay, start_nodes, (self.group, topology, indexes))
        self.timer.start()

    def __enter__(self) -> "react":
        return self

    def __exit__(self, *exc) -> None:
        self.timer.cancel()
        self.timer.join()
        if self.owned:
            self.group.stop()


def event_time(event: dict) -> float:
    return datetime.datetime.fromisoformat(event["time"].replace("Z", "+00:00")).timestamp()


def wait_step(metrics: Path, since: float, predicate) -> float | None:
    """Time of the first step event after `since` that matches `predicate`; None on timeout."""
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        for event in read_events(metrics):
            if event["event"] == "step" and event_time(event) > since and predicate(event):
                return event_time(event)
        time.sleep(0.2)
    return None


def redone_steps(metrics: Path, killed_at: float) -> int | None:
    events = read_events(metrics)
    before = [e["step"] for e in events if e["event"] == "step" and event_time(e) < killed_at]
    starts = [e for e in events if e["event"] == "start" and event_time(e) > killed_at]
    if not before or not starts:
        return None
    return max(before) - starts[0]["resume_step"]


def fmt(seconds: float | None) -> str:
    return "failed" if seconds is None else f"{seconds:.1f}"


def print_table(rows: dict[tuple[str, float], Recovery | None]) -> None:
    print(f"recovery after SIGKILL of node 0's process group ({NODES} nodes, --nnodes=1:{NODES}), "
          "seconds from the kill; 'new pods after' = when the operator's new pods start")
    print(f"{'topology':<22} | {'new pods after':>14} | {'first step':>10} | {f'{NODES} nodes':>8} | "
          f"{'survivors':>9} | {'redone':>6}")
    for (name, delay), row in rows.items():
        if row is None:
            print(f"{name:<22} | {delay:>13.0f}s | {'failed':>10} | {'failed':>8} | {'-':>9} | {'-':>6}")
            continue
        print(f"{name:<22} | {delay:>13.0f}s | {fmt(row.first_step):>10} | {fmt(row.full_size):>8} | "
              f"{'kept' if row.survivors_kept else 'restarted':>9} | "
              f"{row.redone if row.redone is not None else '-':>6}")


if __name__ == "__main__":
    main()
