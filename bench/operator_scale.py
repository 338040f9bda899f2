"""How the operator's cost grows with the number of jobs: 100 and 1,000 jobs x 8 pods, side by side.

For each size, a fresh API emulator and a fresh operator process; all jobs are created at
once and the bench measures (targets in brackets, from issue 17):

* seconds until every node pod exists and every job's status reports 8 replicas, and pods/s;
  the ratio of the two sizes' pods/s [1,000 jobs >= 0.8x the pods/s of 100];
* the operator's API requests by verb, per job, from its start to settled (kopf's own
  requests included: the emulator counts requests by User-Agent, so the bench's are not);
* steady-state requests per job per minute over a quiet window [<= 1], and LIST and GET
  in it [0]: pods here never run (no kubelet), so no progress poll is made;
* operator RSS (now and peak) [<= 200 MB at 1,000 x 8];
* CPU seconds of the operator process and of the emulator's thread, per job: which side
  the time went to, since both share the machine's cores.

The bench waits by watching (one watch on DDPJobs, one on pods) and reads the operator's
metrics once at the end; it never lists in a loop. It runs the operator with no client
rate limit by default (``--qps 0``): the point is the operator's own cost, which a rate
limit of 20 requests/s would hide behind 400 s of waiting for 8,000 creates.

    python -m bench operator_scale                      # 100 and 1,000 jobs, 60 s quiet window
    python -m bench operator_scale --jobs 100,300 --quiet-seconds 20
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import re
import sys
import tempfile
import threading
import time
import urllib.request

from ddpjob_operator.controller.cache import WATCHED
from ddpjob_sandbox.cluster import running_cluster
from ddpjob_sandbox.jobs import make_manifest
from ddpjob_sandbox.operator_process import OperatorProcess
from ddpjob_sandbox.procs import free_port

NODES = 8
NAMESPACE = "bench"
OPERATOR_AGENTS = ("ddpjob-operator", "kopf")  # User-Agent products of the operator's two clients
VERBS = ("LIST", "GET", "WATCH", "POST", "PATCH", "DELETE")
SETTLE_TIMEOUT = float(os.environ.get("BENCH_SETTLE_TIMEOUT", 900))
TARGET_RATIO, TARGET_STEADY, TARGET_RSS_MB = 0.8, 1.0, 200


@dataclasses.dataclass
class Run:
    """What one size measured."""

    jobs: int
    settled: float = 0.0  # seconds from the first create to the last status with 8 replicas
    to_settle: dict = dataclasses.field(default_factory=dict)  # requests by verb, start to settled
    steady: dict = dataclasses.field(default_factory=dict)  # requests by verb in the quiet window
    quiet: float = 0.0
    rss: float = 0.0
    peak: float = 0.0
    operator_cpu: float = 0.0
    emulator_cpu: float = 0.0
    passes: float = 0.0
    errors: float = 0.0

    @property
    def pods_per_second(self) -> float:
        return self.jobs * NODES / self.settled

    def steady_per_job_minute(self) -> float:
        return sum(self.steady.values()) / self.jobs / (self.quiet / 60)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench operator_scale")
    parser.add_argument("--jobs", default="100,1000", help="comma-separated sizes (default: %(default)s)")
    parser.add_argument("--quiet-seconds", type=float, default=60.0, help="steady-state window (default: 60)")
    parser.add_argument("--qps", type=float, default=0.0, help="the operator's --kube-api-qps (default: 0, no limit)")
    parser.add_argument("--concurrency", type=int, default=16, help="--max-concurrent-passes (default: 16)")
    args = parser.parse_args(argv or [])
    runs = [_measure(int(n), args) for n in args.jobs.split(",")]
    _print_table(runs, args)


def _measure(jobs: int, args: argparse.Namespace) -> Run:
    run = Run(jobs)
    with tempfile.TemporaryDirectory() as tmp, running_cluster(pathlib.Path(tmp)) as cluster:
        emulator, k8s, metrics_port = cluster.emulator, cluster.client(NAMESPACE), free_port()
        command = [sys.executable, "-m", "ddpjob_operator", "--namespace", NAMESPACE, "--liveness-port", "0",
                   "--metrics-port", str(metrics_port), "--kube-api-qps", str(args.qps),
                   "--max-concurrent-passes", str(args.concurrency)]
        with OperatorProcess(cluster, command, pathlib.Path(tmp) / "operator.log") as operator:
            # Ready: kopf's job watch and the cache's watches are open.
            _until(lambda: emulator.request_counts(OPERATOR_AGENTS)["WATCH"] >= len(WATCHED) + 1, 60,
                   "the operator's watches")
            emulator_thread = next(t for t in threading.enumerate() if t.name == "kube-emulator")
            cpu_before = _cpu(f"/proc/self/task/{emulator_thread.native_id}/stat"), _cpu(f"/proc/{operator.process.pid}/stat")
            before = emulator.request_counts(OPERATOR_AGENTS)
            watcher = Settled(cluster.url, jobs)
            started = time.perf_counter()
            for i in range(jobs):
                k8s.create("ddpjobs", make_manifest(f"job-{i}", replicas=NODES,
                                                    elasticPolicy={"minReplicas": 1, "maxReplicas": NODES}))
            run.settled = watcher.wait(SETTLE_TIMEOUT) - started
            settled = emulator.request_counts(OPERATOR_AGENTS)
            run.to_settle = {v: (settled[v] - before[v]) / jobs for v in VERBS}
            run.emulator_cpu = _cpu(f"/proc/self/task/{emulator_thread.native_id}/stat") - cpu_before[0]
            run.operator_cpu = _cpu(f"/proc/{operator.process.pid}/stat") - cpu_before[1]
            time.sleep(2)  # the last passes' own writes land before the window opens
            quiet_start = emulator.request_counts(OPERATOR_AGENTS)
            time.sleep(args.quiet_seconds)
            quiet_end = emulator.request_counts(OPERATOR_AGENTS)
            run.steady, run.quiet = {v: quiet_end[v] - quiet_start[v] for v in VERBS}, args.quiet_seconds
            run.rss, run.peak = _rss_mb(operator.process.pid)
            run.passes = _metric(metrics_port, "ddpjob_operator_reconcile_seconds_count")
            run.errors = _metric(metrics_port, "ddpjob_operator_reconcile_errors_total")
    print(f"  {jobs} jobs settled in {run.settled:.1f} s", flush=True)
    return run


class Settled:
    """Watches DDPJobs and pods in the bench namespace until every job reports NODES replicas and
    every node pod exists; ``wait`` returns the perf_counter time when that became true."""

    def __init__(self, url: str, jobs: int):
        self.jobs, self.replicas, self.pods = jobs, {}, set()
        self.lock, self.done, self.at = threading.Lock(), threading.Event(), 0.0
        base = f"{url}/apis/ddpjob.io/v1alpha1/namespaces/{NAMESPACE}/ddpjobs?watch=true"
        pods = f"{url}/api/v1/namespaces/{NAMESPACE}/pods?watch=true&labelSelector=app.kubernetes.io/component%3Dnode"
        for target, handle in ((base, self._job), (pods, self._pod)):
            opened = threading.Event()
            threading.Thread(target=self._read, args=(target, handle, opened), daemon=True).start()
            opened.wait(10)

    def _read(self, url: str, handle, opened: threading.Event) -> None:
        try:
            with urllib.request.urlopen(url, timeout=SETTLE_TIMEOUT + 120) as response:
                opened.set()
                for line in response:
                    if line.strip():
                        event = json.loads(line)
                        with self.lock:
                            handle(event["type"], event["object"])
                            self._check()
        except (OSError, ValueError):
            return  # the emulator stopped (its streams end with it: closing one here would block on its reader)

    def _job(self, kind: str, job: dict) -> None:
        self.replicas[job["metadata"]["name"]] = (job.get("status") or {}).get("replicas")

    def _pod(self, kind: str, pod: dict) -> None:
        (self.pods.discard if kind == "DELETED" else self.pods.add)(pod["metadata"]["name"])

    def _check(self) -> None:
        full = sum(1 for r in self.replicas.values() if r == NODES)
        if not self.done.is_set() and full == self.jobs and len(self.pods) == self.jobs * NODES:
            self.at = time.perf_counter()
            self.done.set()

    def wait(self, timeout: float) -> float:
        if not self.done.wait(timeout):
            raise RuntimeError(f"{self.jobs} jobs x {NODES} pods did not settle within {timeout:.0f} s: "
                               f"{len(self.pods)} pods, {sum(1 for r in self.replicas.values() if r == NODES)} "
                               f"statuses with {NODES} replicas")
        return self.at


def _until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _cpu(stat_path: str) -> float:
    """User + system CPU seconds of a process or thread, from its /proc stat line."""
    fields = pathlib.Path(stat_path).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mb(pid: int) -> tuple[float, float]:
    """Current and peak resident set size of ``pid`` in MB (from /proc)."""
    fields = dict(line.split(":", 1) for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines()
                  if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def _metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    match = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def _print_table(runs: list[Run], args: argparse.Namespace) -> None:
    print(f"operator --kube-api-qps {args.qps:g} --max-concurrent-passes {args.concurrency}; "
          f"quiet window {args.quiet_seconds:g} s", flush=True)
    header = ["measure"] + [f"{r.jobs} jobs x {NODES}" for r in runs] + ["target"]
    first, last = runs[0], runs[-1]
    ratio = last.pods_per_second / first.pods_per_second
    rows = [header,
            ["settled (s)"] + [f"{r.settled:.1f}" for r in runs] + [""],
            ["pods/s"] + [f"{r.pods_per_second:.0f}" for r in runs] + [""],
            [f"pods/s ratio ({last.jobs} / {first.jobs})"] + [""] * (len(runs) - 1) + [f"{ratio:.2f}x",
                                                                                      f">= {TARGET_RATIO}x"],
            ["reconcile passes per job"] + [f"{r.passes / r.jobs:.1f}" for r in runs] + [""],
            ["reconcile errors"] + [f"{r.errors:.0f}" for r in runs] + ["0"]]
    for verb in VERBS:
        rows.append([f"{verb} per job, to settle"] + [f"{r.to_settle[verb]:.2f}" for r in runs] + [""])
    rows.append(["steady LIST + GET (window)"] + [f"{r.steady['LIST'] + r.steady['GET']}" for r in runs] + ["0"])
    rows.append(["steady requests / job / min"] + [f"{r.steady_per_job_minute():.3f}" for r in runs]
                + [f"<= {TARGET_STEADY}"])
    rows.append(["operator RSS now / peak (MB)"] + [f"{r.rss:.0f} / {r.peak:.0f}" for r in runs]
                + [f"<= {TARGET_RSS_MB}"])
    rows.append(["operator CPU per job"] + [f"{r.operator_cpu / r.jobs * 1000:.1f} ms" for r in runs] + [""])
    rows.append(["emulator CPU per job"] + [f"{r.emulator_cpu / r.jobs * 1000:.1f} ms" for r in runs] + [""])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip(), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
