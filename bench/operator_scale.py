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

With ``--running`` the bench then makes every job train: its node pods run (as a kubelet
would report them), and node 0's progress endpoint is one local server whose record's step
moves at every poll, with a snapshot every SNAPSHOT_STEPS steps. Each size runs twice side by
side, the operator writing every status change at once (--status-write-interval-seconds 0:
before issue 26) and with the interval given, and the bench counts the operator's status
writes (PATCHes of ddpjobs by its client) over the quiet window [target: 1,000 jobs polled
every 30 s at <= 2 writes/s, that is <= 0.06 writes per job and poll]. The figure per job
and poll does not depend on the scale, so a short window may use a shorter poll and interval
in the same proportion.

The bench waits by watching (one watch on DDPJobs, one on pods) and reads the operator's
metrics once at the end; it never lists in a loop. It runs the operator with no client
rate limit by default (``--qps 0``): the point is the operator's own cost, which a rate
limit of 20 requests/s would hide behind 400 s of waiting for 8,000 creates.

    python -m bench operator_scale                      # 100 and 1,000 jobs, 60 s quiet window
    python -m bench operator_scale --jobs 100,300 --quiet-seconds 20
    python -m bench operator_scale --running --jobs 100 --poll-seconds 3 --write-interval-seconds 60 \
        --quiet-seconds 120                             # status writes of training jobs, before / after
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import http.server
import json
import os
import pathlib
import re
import sys
import tempfile
import threading
import time
import urllib.request

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.clock import format_time
from ddpjob_operator.controller.cache import WATCHED
from ddpjob_sandbox.cluster import running_cluster
from ddpjob_sandbox.jobs import make_manifest
from ddpjob_sandbox.operator_process import OperatorProcess
from ddpjob_sandbox.procs import free_port
from ddpjob_sandbox.scripted import set_running

NODES = 8
NAMESPACE = "bench"
OPERATOR_AGENTS = ("ddpjob-operator", "kopf")  # User-Agent products of the operator's two clients
VERBS = ("LIST", "GET", "WATCH", "POST", "PATCH", "DELETE")
SETTLE_TIMEOUT = float(os.environ.get("BENCH_SETTLE_TIMEOUT", 900))
TARGET_RATIO, TARGET_STEADY, TARGET_RSS_MB = 0.8, 1.0, 200
TARGET_WRITES = 2.0 / (1000 / 30)  # status writes per job and poll: 1,000 jobs polled every 30 s at <= 2/s
STEP_SECONDS = 0.5  # the fake trainers' step time: the step moves at every poll
SNAPSHOT_STEPS = 50  # ... and a snapshot every this many steps


@dataclasses.dataclass
class Run:
    """What one size measured."""

    jobs: int
    write_interval: float | None = None  # --status-write-interval-seconds (None: not training, not set)
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
    status_writes: int = 0  # the operator's PATCHes of ddpjobs (their status) in the quiet window
    reads: int = 0  # progress records the operator read (from the first poll on), and those it gave up on
    cut_reads: int = 0
    poll: float = 0.0

    def writes_per_job_poll(self) -> float:
        return self.status_writes / self.jobs / (self.quiet / self.poll)

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
    parser.add_argument("--running", action="store_true",
                        help="make the jobs train and count status writes, every change vs the interval")
    parser.add_argument("--poll-seconds", type=float, default=30.0,
                        help="--progress-poll-seconds with --running (default: 30)")
    parser.add_argument("--write-interval-seconds", type=float, default=600.0,
                        help="--status-write-interval-seconds with --running, beside 0 (default: 600)")
    args = parser.parse_args(argv or [])
    if args.running:
        runs = [_measure(int(n), args, interval) for n in args.jobs.split(",")
                for interval in (0.0, args.write_interval_seconds)]
        _print_writes(runs, args)
        return
    runs = [_measure(int(n), args) for n in args.jobs.split(",")]
    _print_table(runs, args)


def _measure(jobs: int, args: argparse.Namespace, write_interval: float | None = None) -> Run:
    run = Run(jobs, write_interval)
    with tempfile.TemporaryDirectory() as tmp, running_cluster(pathlib.Path(tmp)) as cluster:
        emulator, k8s, metrics_port = cluster.emulator, cluster.client(NAMESPACE), free_port()
        command = [sys.executable, "-m", "ddpjob_operator", "--namespace", NAMESPACE, "--liveness-port", "0",
                   "--metrics-port", str(metrics_port), "--kube-api-qps", str(args.qps),
                   "--max-concurrent-passes", str(args.concurrency)]
        if write_interval is not None:
            command += ["--progress-poll-seconds", str(args.poll_seconds),
                        "--status-write-interval-seconds", str(write_interval)]
            run.poll = args.poll_seconds
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
            trainers = _Trainers() if write_interval is not None else None
            if trainers is not None:
                _train(k8s, jobs, trainers.port)
                watcher.wait_phase(C.PHASE_RUNNING, SETTLE_TIMEOUT)
                time.sleep(args.poll_seconds)  # the passes the pod events started are over
            time.sleep(2)  # the last passes' own writes land before the window opens
            quiet_start = emulator.request_counts(OPERATOR_AGENTS)
            writes_start = emulator.request_counts(("ddpjob-operator",), "ddpjobs")["PATCH"]
            time.sleep(args.quiet_seconds)
            quiet_end = emulator.request_counts(OPERATOR_AGENTS)
            run.status_writes = emulator.request_counts(("ddpjob-operator",), "ddpjobs")["PATCH"] - writes_start
            if trainers is not None:
                trainers.close()
                run.reads, run.cut_reads = trainers.served, trainers.cut
            run.steady, run.quiet = {v: quiet_end[v] - quiet_start[v] for v in VERBS}, args.quiet_seconds
            run.rss, run.peak = _rss_mb(operator.process.pid)
            run.passes = _metric(metrics_port, "ddpjob_operator_reconcile_seconds_count")
            run.errors = _metric(metrics_port, "ddpjob_operator_reconcile_errors_total")
    print(f"  {jobs} jobs settled in {run.settled:.1f} s" + ("" if write_interval is None else
          f"; write interval {write_interval:g} s: {run.status_writes} status writes in {run.quiet:g} s, "
          f"{run.reads} progress reads ({run.cut_reads} given up by the operator)"), flush=True)
    return run


def _train(k8s, jobs: int, port: int) -> None:
    """Every node pod runs (podIP 127.0.0.1), and node 0's progress port is the fake trainers'."""
    for i in range(jobs):
        for node in range(NODES):
            name = f"job-{i}-node-{node}"
            if node == 0:
                containers = k8s.get("pods", name)["spec"]["containers"]
                for entry in containers[0]["ports"]:
                    if entry["name"] == C.PROGRESS_PORT_NAME:
                        entry["containerPort"] = port
                k8s.patch("pods", name, {"spec": {"containers": containers}})
            set_running(k8s, name)


class _Trainers:
    """One progress endpoint for every job: a record whose step moves every STEP_SECONDS, with a
    snapshot every SNAPSHOT_STEPS steps and every node's heartbeat (the hang and straggler
    bookkeeping run as for a real job)."""

    def __init__(self):
        started, started_text, trainers = time.time(), format_time_now(), self
        self.served = self.cut = 0  # answers the operator took, and those it gave up on

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                step = int((time.time() - started) / STEP_SECONDS)
                now, snap = format_time_now(), step // SNAPSHOT_STEPS * SNAPSHOT_STEPS
                record = {"kind": C.PROGRESS_RECORD_KIND, "version": 1, "node": "0",
                          "resume": {"time": started_text},
                          "snapshot": {"epoch": 0, "step": snap, "time": format_time_at(started + snap * STEP_SECONDS),
                                       "path": f"/snapshots/snapshot-s{snap:010d}-e000000.pt", "samples_consumed": 0},
                          "nodes": [{"node": str(n), "step": step, "phase": "collective", "stepSeconds": STEP_SECONDS,
                                     "dataSeconds": 0.01, "computeSeconds": 0.05, "heartbeat": now}
                                    for n in range(NODES)]}
                body = json.dumps(record).encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    trainers.served += 1
                except OSError:  # the operator gave up (its 2 s deadline, on a loaded machine): no record this poll
                    trainers.cut += 1

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True, name="fake-trainers").start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def format_time_now() -> str:
    return format_time_at(time.time())


def format_time_at(seconds: float) -> str:
    return format_time(datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc))


class Settled:
    """Watches DDPJobs and pods in the bench namespace until every job reports NODES replicas and
    every node pod exists; ``wait`` returns the perf_counter time when that became true."""

    def __init__(self, url: str, jobs: int):
        self.jobs, self.replicas, self.pods, self.phases = jobs, {}, set(), {}
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
        self.phases[job["metadata"]["name"]] = (job.get("status") or {}).get("phase")

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


    def wait_phase(self, phase: str, timeout: float) -> None:
        def every_job() -> bool:
            with self.lock:
                return sum(1 for p in self.phases.values() if p == phase) == self.jobs
        _until(every_job, timeout, f"every job in phase {phase}")


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


def _print_writes(runs: list[Run], args: argparse.Namespace) -> None:
    """Status writes of training jobs, every change (0) vs the interval, side by side per size."""
    print(f"operator --progress-poll-seconds {args.poll_seconds:g}; quiet window {args.quiet_seconds:g} s; "
          f"jobs train ({NODES} running pods, step every {STEP_SECONDS:g} s)", flush=True)
    # Writes per job and poll depend on interval / poll only: scaled to 1,000 jobs polled every 30 s
    # with the interval in the same proportion (600 s for a 3 s poll and a 60 s interval).
    rows = [["jobs", "write interval (s)", "status writes", "writes/s", "writes / job / poll",
             "1,000 jobs, 30 s poll, interval x 30 / poll (writes/s)", "target"]]
    for run in runs:
        per = run.writes_per_job_poll()
        rows.append([str(run.jobs), f"{run.write_interval:g}", str(run.status_writes),
                     f"{run.status_writes / run.quiet:.2f}", f"{per:.3f}", f"{per * 1000 / 30:.2f}",
                     f"<= {TARGET_WRITES:.3f} per job and poll (2/s)"])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip(), flush=True)
    for before, after in zip(runs[::2], runs[1::2]):
        ratio = after.status_writes / before.status_writes if before.status_writes else float("nan")
        print(f"{before.jobs} jobs: status writes with the interval / every change: {ratio:.3f}x", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
