"""Rendezvous cost on loopback: c10d vs torch's etcd-v2 vs ddpjob's etcd-v3, and recovery after losing a node.

Two measurements (this is a two-core machine; expect +-20 %):

* rendezvous: N agents (``--nnodes=N``, so no last-call wait) with one
  worker each. ``rdzv`` is from the moment the last agent starts its
  rendezvous to the moment the last agent finished it, ``span`` from the
  first agent's start of rendezvous instead (both from the agents' INFO
  logs); ``launch`` is from starting the first agent to every worker's first
  line, so it includes importing torch (and etcd3/grpc) in N processes. Both are the
  mean of ``REPEATS`` runs: waiting agents poll the state once a second, so a
  single run is off by up to a second whatever the backend.
* recovery: three agents train (``--nnodes=1:3``); the whole process group of
  node 0 (c10d's store host) or of node 2 is killed; the time is from the kill
  until both survivors' new workers (world size 2) are up, split into
  ``detect`` (until both survivors' agents start a new rendezvous) and the rest.
"""
from __future__ import annotations

import datetime
import re
import sys
import tempfile
import time
from pathlib import Path

from ddpjob_sandbox.etcd import V2, V3, api_for_backend, running_etcd
from ddpjob_sandbox.procs import free_port
from ddpjob_sandbox.torchrun import FAST_RDZV_CONF, AgentGroup, Rendezvous, unique_run_id

WORKER = Path(__file__).with_name("_rdzv_worker.py")
BACKENDS = ("c10d", "etcd-v2", "etcd-v3")
SIZES = (2, 4, 8)
REPEATS = 3
# torch's elastic loggers print INFO lines (with timestamps) only when asked.
AGENT_ENV = {"LOGLEVEL": "INFO"}
_LOG_STAMP = re.compile(r"^I(\d\d)(\d\d) (\d\d:\d\d:\d\d\.\d+) ")


def main() -> None:
    # torch's etcd-v2 on Debian's etcd 3.4 (the v2 API), ddpjob's etcd-v3 on the pinned 3.6.
    with running_etcd(api=V2) as etcd_v2, running_etcd(api=V3) as etcd_v3, \
            tempfile.TemporaryDirectory(prefix="bench-rdzv-") as tmp:
        etcd = {V2: etcd_v2, V3: etcd_v3}
        workdir = Path(tmp)
        rows = {(backend, n): mean_of([measure_rendezvous(workdir, etcd, backend, n, repeat)
                                       for repeat in range(REPEATS)])
                for n in SIZES for backend in BACKENDS}
        print_rendezvous_table(rows)
        recovery = {(backend, lost): measure_recovery(workdir, etcd, backend, lost)
                    for backend in ("c10d", "etcd-v3") for lost in (0, 2)}
        print_recovery_table(recovery)


def rendezvous_for(backend: str, etcd: dict, nnodes: str) -> Rendezvous:
    """``etcd``: the servers by API (ddpjob_sandbox.etcd.V2, V3); the backend's is used."""
    conf = {**FAST_RDZV_CONF, "join_timeout": 120}
    endpoint = f"127.0.0.1:{free_port()}" if backend == "c10d" else etcd[api_for_backend(backend)].endpoint
    return Rendezvous(backend, endpoint, unique_run_id(), nnodes, conf)


def mean_of(results: list[tuple | None]) -> tuple | None:
    if any(result is None for result in results):
        return None
    return tuple(sum(values) / len(values) for values in zip(*results))


def measure_rendezvous(workdir: Path, etcd, backend: str, n: int, repeat: int) -> tuple[float, float, float] | None:
    """Returns (rdzv, span, launch) seconds or None when the agents failed."""
    run_dir = workdir / f"rdzv-{backend}-{n}-{repeat}"
    run_dir.mkdir()
    up_file = run_dir / "up"
    rdzv = rendezvous_for(backend, etcd, str(n))
    with AgentGroup(run_dir, rdzv, [str(WORKER)], env={**AGENT_ENV, "BENCH_UP_FILE": str(up_file)}) as group:
        started = time.time()
        for index in range(n):
            # c10d: node 0 hosts the store, as a pod named <job>-node-0 would.
            group.start(rdzv_conf_extra={"is_host": index == 0} if backend == "c10d" else None)
        codes = group.wait_all(180)
    if set(codes.values()) != {0}:
        print(f"  {backend} x{n}: agents exited {codes}\n{group.logs(800)}", file=sys.stderr)
        return None
    asked = [log_times(agent.log_path, "Rendezvous'ing worker group")[0] for agent in group.agents]
    done = [log_times(agent.log_path, "Rendezvous complete for workers")[0] for agent in group.agents]
    worker_up = max(float(line.split()[0]) for line in up_file.read_text().splitlines())
    return max(done) - max(asked), max(done) - min(asked), worker_up - started


def measure_recovery(workdir: Path, etcd, backend: str, lost: int) -> tuple[float, float] | None:
    """(detect, total) seconds from killing node ``lost`` to both survivors' new workers being up; None if
    the job died."""
    run_dir = workdir / f"recovery-{backend}-{lost}"
    run_dir.mkdir()
    up_file = run_dir / "up"
    rdzv = rendezvous_for(backend, etcd, "1:3")
    env = {**AGENT_ENV, "BENCH_UP_FILE": str(up_file)}
    with AgentGroup(run_dir, rdzv, [str(WORKER), "--train"], env=env, max_restarts=3) as group:
        for index in range(3):
            group.start(rdzv_conf_extra={"is_host": index == 0} if backend == "c10d" else None)
        if wait_for_world(up_file, world=3, count=3, since=0.0, timeout=120) is None:
            print(f"  {backend}: three nodes never trained\n{group.logs(800)}", file=sys.stderr)
            return None
        killed_at = time.time()
        group.agents[lost].kill()
        recovered = wait_for_world(up_file, world=2, count=2, since=killed_at, timeout=90,
                                   alive=lambda: bool(group.running()))
    if recovered is None:
        return None
    survivors = [agent for index, agent in enumerate(group.agents) if index != lost]
    asked = [min(t for t in log_times(agent.log_path, "Rendezvous'ing worker group") if t > killed_at)
             for agent in survivors]
    return max(asked) - killed_at, recovered - killed_at


def wait_for_world(up_file: Path, world: int, count: int, since: float, timeout: float,
                   alive=lambda: True) -> float | None:
    """Time of the ``count``-th worker start with world size ``world`` after ``since``; None on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and alive():
        lines = up_file.read_text().splitlines() if up_file.exists() else []
        times = sorted(float(t) for t, _, size, _ in (line.split() for line in lines)
                       if int(size) == world and float(t) > since)
        if len(times) >= count:
            return times[count - 1]
        time.sleep(0.1)
    return None


def log_times(path: Path, needle: str) -> list[float]:
    """Wall-clock times of the INFO log lines of ``path`` that contain ``needle``."""
    year = datetime.datetime.now().year
    found = []
    for line in path.read_text(errors="replace").splitlines():
        match = _LOG_STAMP.match(line)
        if match and needle in line:
            month, day, clock = match.groups()
            stamp = datetime.datetime.strptime(f"{year}-{month}-{day} {clock}", "%Y-%m-%d %H:%M:%S.%f")
            found.append(stamp.timestamp())
    if not found:
        raise RuntimeError(f"no log line with {needle!r} in {path}")
    return found


def fmt(seconds: float | None) -> str:
    return "failed" if seconds is None else f"{seconds:6.2f}"


def ratio(value: float | None, base: float | None) -> str:
    return "-" if value is None or not base else f"{value / base:.2f}x"


def print_rendezvous_table(rows: dict) -> None:
    print(f"rendezvous on loopback, seconds, mean of {REPEATS} runs (rdzv: last agent asks -> last agent done;"
          " span: first agent asks -> last done; launch: first agent start -> every worker's first line)")
    columns = ("rdzv", "span", "launch")
    print(f"{'':>6} | " + " | ".join(f"{backend:^20}" for backend in BACKENDS) + f" | {'etcd-v3 / c10d':^20}")
    print(f"{'agents':>6} | " + " | ".join(" ".join(f"{c:>6}" for c in columns) for _ in range(len(BACKENDS) + 1)))
    for n in SIZES:
        cells = []
        for backend in BACKENDS:
            result = rows[(backend, n)]
            cells.append(" ".join(f"{fmt(result and result[i]):>6}" for i in range(len(columns))))
        c10d, v3 = rows[("c10d", n)], rows[("etcd-v3", n)]
        cells.append(" ".join(f"{ratio(v3 and v3[i], c10d and c10d[i]):>6}" for i in range(len(columns))))
        print(f"{n:>6} | " + " | ".join(cells))


def print_recovery_table(recovery: dict) -> None:
    print("\nrecovery after killing one node's process group (3 nodes, --nnodes=1:3), seconds until both survivors'"
          " new workers are up (detect: until both survivors started a new rendezvous); 'failed' = the job died")
    print(f"{'backend':>8} | {'lose node 0':>11} {'(detect)':>8} | {'lose node 2':>11} {'(detect)':>8} | node0/node2")
    for backend in ("c10d", "etcd-v3"):
        first, last = recovery[(backend, 0)], recovery[(backend, 2)]
        speed = ratio(first and first[1], last and last[1])
        print(f"{backend:>8} | {fmt(first and first[1]):>11} {fmt(first and first[0]):>8} | "
              f"{fmt(last and last[1]):>11} {fmt(last and last[0]):>8} | {speed:>11}")

if __name__ == "__main__":
    main()
