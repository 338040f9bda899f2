"""Operator benchmark: the real operator process against the test-side API emulator.

Measures (targets in brackets):
* apply -> all node pods exist, with a warm operator, for 1 and 8 nodes [8 nodes <= 0.5 s];
* a node pod fails (backoffSeconds 0) -> its replacement exists (delete, then create);
* reconcile errors [none] and the operator's resident memory [peak RSS <= 150 MB].

Many jobs at once (100 and 1,000 x 8 pods, requests by verb, steady state): bench/operator_scale.py.

The emulator runs in this process (a thread), the operator in its own; both share the
machine's CPUs, so the figures include the API server's own cost, as on a small cluster.
"""
from __future__ import annotations

import pathlib
import re
import statistics
import sys
import tempfile
import time
import urllib.request

from ddpjob_operator.render.common import selector as node_selector

from ddpjob_sandbox.jobs import make_manifest
from ddpjob_sandbox.scripted import set_terminated
from ddpjob_sandbox.operator_process import OperatorProcess
from ddpjob_sandbox.cluster import running_cluster
from ddpjob_sandbox.procs import free_port

REPEATS = 5  # warm apply measurements per size
TARGET_WARM_8_SECONDS = 0.5
TARGET_RSS_MB = 150


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp, running_cluster(pathlib.Path(tmp)) as cluster:
        metrics_port = free_port()
        k8s = cluster.client("bench")
        command = [sys.executable, "-m", "ddpjob_operator", "--namespace", "bench",
                   "--liveness-port", "0", "--metrics-port", str(metrics_port)]
        with OperatorProcess(cluster, command, pathlib.Path(tmp) / "operator.log") as operator:
            _time_apply(k8s, "warmup", 2)  # imports, first watch events, first connections
            warm = {nodes: [_time_apply(k8s, f"w{nodes}-{i}", nodes) for i in range(REPEATS)] for nodes in (1, 8)}
            replace = [_time_replacement(k8s, f"r{i}") for i in range(REPEATS)]
            errors = _metric(metrics_port, "ddpjob_operator_reconcile_errors_total")
            passes = _metric(metrics_port, "ddpjob_operator_reconcile_seconds_count")
            rss, peak = _rss_mb(operator.process.pid)
            log_errors = sum(1 for line in operator.log().splitlines() if "[ERROR" in line or "Traceback" in line)
    _print_table(warm, replace, errors, log_errors, passes, rss, peak)


def _time_apply(k8s, name: str, nodes: int) -> float:
    """Seconds from the create call to the moment all ``nodes`` pods exist; then deletes the job."""
    started = time.perf_counter()
    k8s.create("ddpjobs", _job(name, nodes))
    selector = node_selector(name)  # the store pod (rdzvStore: pod) is not a node
    while len(k8s.list("pods", label_selector=selector)) < nodes:
        time.sleep(0.002)
    elapsed = time.perf_counter() - started
    k8s.delete("ddpjobs", name)
    while k8s.list("pods", label_selector=selector):  # the garbage collector removes the pods
        time.sleep(0.01)
    return elapsed


def _time_replacement(k8s, name: str) -> float:
    """Seconds from a node pod's failure (as the kubelet reports it) to its replacement's creation."""
    body = _job(name, 2)
    body["spec"]["failurePolicy"] = {"maxRestarts": 100, "backoffSeconds": 0}
    k8s.create("ddpjobs", body)
    pod = f"{name}-node-1"
    while (old := k8s.find("pods", pod)) is None:
        time.sleep(0.002)
    started = time.perf_counter()
    set_terminated(k8s, pod, 1)
    while (new := k8s.find("pods", pod)) is None or new["metadata"]["uid"] == old["metadata"]["uid"]:
        time.sleep(0.002)
    elapsed = time.perf_counter() - started
    k8s.delete("ddpjobs", name)
    return elapsed


def _job(name: str, nodes: int) -> dict:
    return make_manifest(name, replicas=nodes, elasticPolicy={"minReplicas": 1, "maxReplicas": 8})


def _metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    match = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def _rss_mb(pid: int) -> tuple[float, float]:
    """Current and peak resident set size of ``pid`` in MB (from /proc)."""
    fields = dict(line.split(":", 1) for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines()
                  if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def _print_table(warm, replace, errors, log_errors, passes, rss, peak) -> None:
    rows = [("measure", "value", "target", "ok")]
    for nodes, samples in warm.items():
        median, worst = statistics.median(samples), max(samples)
        target = f"<= {TARGET_WARM_8_SECONDS} s" if nodes == 8 else ""
        ok = ("yes" if median <= TARGET_WARM_8_SECONDS else "NO") if nodes == 8 else ""
        rows.append((f"apply -> {nodes} pods (warm, median/max of {len(samples)})",
                     f"{median:.3f} s / {worst:.3f} s", target, ok))
    rows.append((f"failed pod -> replacement (median/max of {len(replace)})",
                 f"{statistics.median(replace):.3f} s / {max(replace):.3f} s", "", ""))
    rows.append(("reconcile passes (whole run)", f"{passes:.0f}", "", ""))
    rows.append(("reconcile errors / ERROR log lines", f"{errors:.0f} / {log_errors}", "0 / 0",
                 "yes" if errors == 0 and log_errors == 0 else "NO"))
    rows.append(("operator RSS now / peak", f"{rss:.0f} MB / {peak:.0f} MB", f"<= {TARGET_RSS_MB} MB",
                 "yes" if peak <= TARGET_RSS_MB else "NO"))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip(), flush=True)


if __name__ == "__main__":
    main()
