"""How the operator's cost grows with the number of jobs, on the real control plane (issue 22):
100 and 1,000 jobs x 8 pods, with the chart's default API rate limit and with it off, side by side.

For each size and rate limit: a fresh control plane (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler) with NODES_PER_CLUSTER status-only Nodes (control_plane/status_nodes.py: registered
and renewed as a kubelet's, every bound pod reported Running, no process), and a fresh operator:
the chart rendered by helm, its Deployment's args run as a local process under a token of the
chart's ServiceAccount (bench/_control_plane.py says why). Every pod's address is one local
server answering every job's progress record (step moving at every poll, a snapshot every
SNAPSHOT_STEPS steps), so every job trains as far as the operator can tell. All jobs are created at
once and the bench measures (targets in brackets, from issues 17 and 26):

* seconds to create the jobs, until every node pod exists and every job's status reports 8
  replicas (settled), until every pod is Running (bound by the scheduler, reported by its Node);
  pods/s and the ratio of the two sizes' [1,000 jobs >= 0.8x the pods/s of 100, without limit];
* the operator's API requests by verb per job, from its start to settled, from the API server's
  audit log (kopf's and the operator's own client log in as the same ServiceAccount);
* steady state over the quiet window: requests per job per minute [<= 1], LIST and GET [0], and
  status writes/s of the running jobs [1,000 jobs polled every 30 s: <= 2 writes/s in total];
* operator RSS now / peak [<= 200 MB at 1,000 x 8], the API server's and etcd's peak RSS;
* CPU seconds per job of the operator, of kube-apiserver + etcd, of the controller manager +
  scheduler: which side the time went to on a shared machine.

With ``--running`` each size runs twice side by side instead, the operator writing every status
change at once (--status-write-interval-seconds 0: before issue 26) and with the interval given,
and the bench counts its status writes (PATCHes of ddpjobs/status) in the quiet window. The figure
per job and poll does not depend on the scale, so a short window may use a shorter poll and
interval in the same proportion.

The bench waits by watching (one watch on DDPJobs, one on pods) and reads the operator's metrics
once at the end; it never lists in a loop. The emulator's figures of this bench (docs/design/
benchmarks.md) come from bench/operator_scale.py before this change (git history).

On the shared 2-core machine (load 30-60) 100 x 8 takes 7-11 minutes per run and 1,000 x 8 does
not finish (docs/design/benchmarks.md, "The benches on the real control plane"); with the chart's
20 requests/s, 1,000 jobs need ~19 minutes of the operator's requests alone on any machine.

    python -m bench operator_scale                      # 100 and 1,000 jobs, chart QPS (20) and 0
    python -m bench operator_scale --jobs 100 --qps 0 --quiet-seconds 60
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
from ddpjob_sandbox.jobs import make_manifest
from ddpjob_sandbox.node.network import pod_ip
from ddpjob_sandbox.operator_process import OperatorProcess
from ddpjob_sandbox.procs import free_port

from bench._control_plane import AuditLog, Watched, arg_value, bench_cluster, chart_operator, cpu_seconds, rss_mb

NODES = 8
NODES_PER_CLUSTER = 10  # status-only Nodes of 1,000 pods each: room for 1,000 jobs x 8
NAMESPACE = "bench"
VERBS = ("list", "get", "watch", "create", "patch", "update", "delete")
SETTLE_TIMEOUT = float(os.environ.get("BENCH_SETTLE_TIMEOUT", 900))
CREATE_TIMEOUT = 120.0
TARGET_RATIO, TARGET_STEADY, TARGET_RSS_MB = 0.8, 1.0, 200
TARGET_WRITES = 2.0 / (1000 / 30)  # status writes per job and poll: 1,000 jobs polled every 30 s at <= 2/s
STEP_SECONDS = 0.5  # the fake trainers' step time: the step moves at every poll
SNAPSHOT_STEPS = 50  # ... and a snapshot every this many steps
# Where every pod's progress is answered: one loopback address of the pod network's range (the
# control plane listens on 127.0.0.1, the kubelets' pods on their own hashed addresses).
PROGRESS_ADDRESS = pod_ip(NAMESPACE, f"progress-{os.getpid()}")


@dataclasses.dataclass
class Run:
    """What one size and rate limit measured."""

    jobs: int
    qps: str  # the operator's --kube-api-qps as the chart rendered it
    write_interval: float = 0.0
    poll: float = 0.0
    created: float = 0.0  # seconds to create every job
    settled: float = 0.0  # seconds from the first create to the last status with 8 replicas
    running: float = 0.0  # ... to the last pod Running
    to_settle: dict = dataclasses.field(default_factory=dict)  # requests by verb per job, start to settled
    steady: dict = dataclasses.field(default_factory=dict)  # requests by verb in the quiet window
    quiet: float = 0.0
    rss: float = 0.0
    peak: float = 0.0
    apiserver_peak: float = 0.0
    etcd_peak: float = 0.0
    operator_cpu: float = 0.0
    apiserver_cpu: float = 0.0  # kube-apiserver + etcd
    controllers_cpu: float = 0.0  # kube-controller-manager + kube-scheduler
    passes: float = 0.0
    errors: float = 0.0
    status_writes: int = 0  # the operator's PATCHes of ddpjobs/status in the quiet window
    reads: int = 0  # progress records the operator read (from the first poll on), and those it gave up on
    cut_reads: int = 0

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
    parser.add_argument("--qps", default="chart,0",
                        help="comma-separated --kube-api-qps: 'chart' keeps the chart's default (default: %(default)s)")
    parser.add_argument("--quiet-seconds", type=float, default=60.0, help="steady-state window (default: 60)")
    parser.add_argument("--concurrency", type=int, default=None, help="--max-concurrent-passes (default: the chart's)")
    parser.add_argument("--running", action="store_true",
                        help="count status writes of training jobs, every change vs the interval")
    parser.add_argument("--poll-seconds", type=float, default=None,
                        help="--progress-poll-seconds (default: the chart's, 30)")
    parser.add_argument("--write-interval-seconds", type=float, default=None,
                        help="--status-write-interval-seconds (default: the chart's, 600; with --running beside 0)")
    args = parser.parse_args(argv or [])
    sizes, limits = [int(n) for n in args.jobs.split(",")], args.qps.split(",")
    if args.running:
        runs = [_measure(n, args, limits[0], interval) for n in sizes for interval in (0.0, args.write_interval_seconds)]
        _print_writes(runs, args)
        return
    runs = [_measure(n, args, qps, args.write_interval_seconds) for qps in limits for n in sizes]
    _print_table(runs, args)


def _values(args: argparse.Namespace, qps: str, write_interval: float | None, metrics_port: int) -> dict:
    """helm values: the chart's defaults but the namespace, free local ports and what the run varies."""
    values = {"watchNamespaces": [NAMESPACE], "livenessPort": free_port(), "metrics.enabled": True,
              "metrics.port": metrics_port}
    if qps != "chart":
        values["kubeApi.qps"] = float(qps)
    if args.concurrency is not None:
        values["maxConcurrentPasses"] = args.concurrency
    if args.poll_seconds is not None:
        values["progressPollSeconds"] = args.poll_seconds
    if write_interval is not None:
        values["statusWriteIntervalSeconds"] = write_interval
    return values


def _measure(jobs: int, args: argparse.Namespace, qps: str, write_interval: float | None) -> Run:
    metrics_port = free_port()
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp, _Trainers() as trainers, \
            bench_cluster(pathlib.Path(tmp), NODES_PER_CLUSTER, pod_ip=lambda pod: PROGRESS_ADDRESS) as cluster:
        k8s = cluster.namespace(NAMESPACE)
        operator_login = chart_operator(cluster, NAMESPACE, _values(args, qps, write_interval, metrics_port),
                                        pathlib.Path(tmp))
        argv = operator_login.argv
        run = Run(jobs, arg_value(argv, "--kube-api-qps"), float(arg_value(argv, "--status-write-interval-seconds")),
                  float(arg_value(argv, "--progress-poll-seconds")))
        audit, user = AuditLog(cluster.control_plane.layout.audit_log), operator_login.user
        pids = cluster.component_pids()
        start_mark = audit.mark()
        with OperatorProcess(operator_login, argv, pathlib.Path(tmp) / "operator.log") as operator:
            # Ready: kopf's job watch and the cache's watches are open.
            _until(lambda: audit.counts(start_mark, audit.mark(), user)["watch"] >= len(WATCHED) + 1, 120,
                   "the operator's watches", operator)
            cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
            operator_before = cpu_seconds(operator.process.pid)
            watcher = Settled(k8s, jobs)
            before_mark, started = audit.mark(), time.perf_counter()
            for i in range(jobs):
                body = make_manifest(f"job-{i}", replicas=NODES, elasticPolicy={"minReplicas": 1, "maxReplicas": NODES})
                # A create waits on admission, CEL and etcd beside 8,000 pods' writes: a loaded
                # machine takes seconds, the client's default 10 s is not the bench's bound.
                k8s.request("POST", k8s.path("ddpjobs"), body, timeout=CREATE_TIMEOUT)
            run.created = time.perf_counter() - started
            run.settled = watcher.wait(SETTLE_TIMEOUT) - started
            settled_mark = audit.mark()
            run.to_settle = {v: n / jobs for v, n in audit.counts(before_mark, settled_mark, user).items()}
            run.running = watcher.wait_running(SETTLE_TIMEOUT) - started
            cpu = {name: cpu_seconds(pid) - cpu_before[name] for name, pid in pids.items()}
            run.apiserver_cpu = cpu["kube-apiserver"] + cpu["etcd"]
            run.controllers_cpu = cpu["kube-controller-manager"] + cpu["kube-scheduler"]
            run.operator_cpu = cpu_seconds(operator.process.pid) - operator_before
            watcher.wait_phase(C.PHASE_RUNNING, SETTLE_TIMEOUT)
            # The passes the pod events started are over, and every job was polled once.
            time.sleep(run.poll + 2)
            served = trainers.served
            quiet_start = audit.mark()
            time.sleep(args.quiet_seconds)
            quiet_end = audit.mark()
            run.steady, run.quiet = dict(audit.counts(quiet_start, quiet_end, user)), args.quiet_seconds
            run.status_writes = audit.counts(quiet_start, quiet_end, user, "ddpjobs", "status")["patch"]
            run.reads, run.cut_reads = trainers.served - served, trainers.cut
            run.rss, run.peak = rss_mb(operator.process.pid)
            run.apiserver_peak, run.etcd_peak = rss_mb(pids["kube-apiserver"])[1], rss_mb(pids["etcd"])[1]
            run.passes = _metric(metrics_port, "ddpjob_operator_reconcile_seconds_count")
            run.errors = _metric(metrics_port, "ddpjob_operator_reconcile_errors_total")
            watcher.close()
    print(f"  {jobs} jobs, --kube-api-qps {run.qps}: created in {run.created:.1f} s, settled in {run.settled:.1f} s, "
          f"all Running in {run.running:.1f} s; write interval {run.write_interval:g} s: {run.status_writes} status "
          f"writes in {run.quiet:g} s, {run.reads} progress reads in it ({run.cut_reads} given up by the operator)",
          flush=True)
    return run


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

        # Every pod's address (the status-only Nodes report it) and the port the pods name.
        self.server = http.server.ThreadingHTTPServer((PROGRESS_ADDRESS, C.PROGRESS_PORT), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True, name="fake-trainers").start()

    def __enter__(self) -> "_Trainers":
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def format_time_now() -> str:
    return format_time_at(time.time())


def format_time_at(seconds: float) -> str:
    return format_time(datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc))


class Settled:
    """Watches DDPJobs and node pods in the bench namespace (as the admin, list then watch) until
    every job reports NODES replicas and every node pod exists; ``wait`` returns the perf_counter
    time when that became true (checked every CHECK_SECONDS on copies of the watched objects),
    ``wait_running`` when every node pod was Running."""

    CHECK_SECONDS = 0.2

    def __init__(self, kube, jobs: int):
        self.jobs = jobs
        self.done, self.at = threading.Event(), 0.0
        self.all_running, self.running_at = threading.Event(), 0.0
        self.jobs_watch = Watched(kube, kube.path("ddpjobs"))
        self.pods_watch = Watched(kube, kube.path("pods"), label_selector="app.kubernetes.io/component=node")
        self._closed = threading.Event()
        threading.Thread(target=self._loop, daemon=True, name="settled").start()

    def _statuses(self) -> list[dict]:
        return [j.get("status") or {} for j in list(self.jobs_watch.objects.values())]

    def _pod_phases(self) -> list[str | None]:
        return [(p.get("status") or {}).get("phase") for p in list(self.pods_watch.objects.values())]

    def _loop(self) -> None:
        while not self._closed.wait(self.CHECK_SECONDS):
            now, phases = time.perf_counter(), self._pod_phases()
            replicas = sum(1 for s in self._statuses() if s.get("replicas") == NODES)
            if not self.done.is_set() and replicas == self.jobs and len(phases) == self.jobs * NODES:
                self.at = now
                self.done.set()
            if not self.all_running.is_set() and phases.count("Running") == self.jobs * NODES:
                self.running_at = now
                self.all_running.set()

    def wait(self, timeout: float) -> float:
        if not self.done.wait(timeout):
            replicas = sum(1 for s in self._statuses() if s.get("replicas") == NODES)
            raise RuntimeError(f"{self.jobs} jobs x {NODES} pods did not settle within {timeout:.0f} s: "
                               f"{len(self._pod_phases())} pods, {replicas} statuses with {NODES} replicas; watch "
                               f"errors: {self.jobs_watch.errors[-3:]} {self.pods_watch.errors[-3:]}")
        return self.at

    def wait_running(self, timeout: float) -> float:
        if not self.all_running.wait(timeout):
            raise RuntimeError(f"{self._pod_phases().count('Running')} of {self.jobs * NODES} pods Running "
                               f"after {timeout:.0f} s")
        return self.running_at

    def wait_phase(self, phase: str, timeout: float) -> None:
        _until(lambda: sum(1 for s in self._statuses() if s.get("phase") == phase) == self.jobs, timeout,
               f"every job in phase {phase}")

    def close(self) -> None:
        self._closed.set()
        self.jobs_watch.close()
        self.pods_watch.close()


def _until(predicate, timeout: float, what: str, operator: OperatorProcess | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            log = "" if operator is None else f"; the operator's log ends:\n{operator.log()[-3000:]}"
            raise RuntimeError(f"timed out waiting for {what}{log}")
        time.sleep(0.2)


def _metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    match = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def _print_table(runs: list[Run], args: argparse.Namespace) -> None:
    print(f"real control plane, {NODES_PER_CLUSTER} status-only Nodes; operator as the chart renders it "
          f"(--progress-poll-seconds {runs[0].poll:g}, --status-write-interval-seconds {runs[0].write_interval:g}); "
          f"quiet window {args.quiet_seconds:g} s", flush=True)
    header = ["measure"] + [f"{r.jobs} x {NODES}, qps {r.qps}" for r in runs] + ["target"]
    rows = [header,
            ["jobs created (s)"] + [f"{r.created:.1f}" for r in runs] + [""],
            ["settled (s)"] + [f"{r.settled:.1f}" for r in runs] + [""],
            ["every pod Running (s)"] + [f"{r.running:.1f}" for r in runs] + [""],
            ["pods/s (to settled)"] + [f"{r.pods_per_second:.1f}" for r in runs] + [""],
            ["reconcile passes per job"] + [f"{r.passes / r.jobs:.1f}" for r in runs] + [""],
            ["reconcile errors"] + [f"{r.errors:.0f}" for r in runs] + ["0"]]
    for verb in VERBS:
        rows.append([f"{verb} per job, to settle"] + [f"{r.to_settle.get(verb, 0):.2f}" for r in runs] + [""])
    rows.append(["steady list + get (window)"] + [f"{r.steady.get('list', 0) + r.steady.get('get', 0)}" for r in runs]
                + ["0"])
    rows.append(["steady requests / job / min"] + [f"{r.steady_per_job_minute():.3f}" for r in runs]
                + [f"<= {TARGET_STEADY}"])
    rows.append(["status writes/s (running jobs)"] + [f"{r.status_writes / r.quiet:.2f}" for r in runs]
                + ["<= 2 at 1,000 jobs"])
    rows.append(["progress reads in the window"] + [str(r.reads) for r in runs] + [""])
    rows.append(["operator RSS now / peak (MB)"] + [f"{r.rss:.0f} / {r.peak:.0f}" for r in runs]
                + [f"<= {TARGET_RSS_MB}"])
    rows.append(["kube-apiserver / etcd peak RSS (MB)"] + [f"{r.apiserver_peak:.0f} / {r.etcd_peak:.0f}"
                                                          for r in runs] + [""])
    rows.append(["operator CPU per job"] + [f"{r.operator_cpu / r.jobs * 1000:.1f} ms" for r in runs] + [""])
    rows.append(["apiserver + etcd CPU per job"] + [f"{r.apiserver_cpu / r.jobs * 1000:.1f} ms" for r in runs] + [""])
    rows.append(["controller-manager + scheduler CPU per job"]
                + [f"{r.controllers_cpu / r.jobs * 1000:.1f} ms" for r in runs] + [""])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip(), flush=True)
    for qps in dict.fromkeys(r.qps for r in runs):
        sized = [r for r in runs if r.qps == qps]
        if len(sized) > 1:
            print(f"qps {qps}: pods/s ratio {sized[-1].jobs} / {sized[0].jobs} jobs: "
                  f"{sized[-1].pods_per_second / sized[0].pods_per_second:.2f}x (target >= {TARGET_RATIO}x)", flush=True)
    for jobs in dict.fromkeys(r.jobs for r in runs):
        limits = [r for r in runs if r.jobs == jobs]
        if len(limits) > 1:
            print(f"{jobs} jobs: settled with qps {limits[0].qps} / qps {limits[-1].qps}: "
                  f"{limits[0].settled / limits[-1].settled:.2f}x", flush=True)


def _print_writes(runs: list[Run], args: argparse.Namespace) -> None:
    """Status writes of training jobs, every change (0) vs the interval, side by side per size."""
    print(f"real control plane; operator --progress-poll-seconds {runs[0].poll:g}, --kube-api-qps {runs[0].qps}; quiet window {args.quiet_seconds:g} s; "
          f"jobs train ({NODES} running pods, step every {STEP_SECONDS:g} s)", flush=True)
    # Writes per job and poll depend on interval / poll only: scaled to 1,000 jobs polled every 30 s
    # with the interval in the same proportion (600 s for a 3 s poll and a 60 s interval).
    # A loaded machine polls less often than asked: writes per progress read the operator took is
    # the figure that does not depend on it (per nominal poll it would flatter the every-change side).
    rows = [["jobs", "write interval (s)", "status writes", "progress reads", "writes/s", "writes / job / poll",
             "writes / read", "1,000 jobs, 30 s poll, interval x 30 / poll (writes/s, per read)", "target"]]
    for run in runs:
        per, per_read = run.writes_per_job_poll(), run.status_writes / max(run.reads, 1)
        rows.append([str(run.jobs), f"{run.write_interval:g}", str(run.status_writes), str(run.reads),
                     f"{run.status_writes / run.quiet:.2f}", f"{per:.3f}", f"{per_read:.3f}",
                     f"{per_read * 1000 / 30:.2f}", f"<= {TARGET_WRITES:.3f} per job and poll (2/s)"])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip(), flush=True)
    for before, after in zip(runs[::2], runs[1::2]):
        ratio = after.status_writes / before.status_writes if before.status_writes else float("nan")
        print(f"{before.jobs} jobs: status writes with the interval / every change: {ratio:.3f}x", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
