"""Operator benchmark: the real operator process on the real control plane (issue 22).

Measures (targets in brackets):
* apply -> all node pods exist, with a warm operator, for 1 and 8 nodes [8 nodes <= 0.5 s], and
  the ratio of the two (what 7 more pods cost);
* a node pod fails (backoffSeconds 0) -> its replacement exists (delete, then create);
* reconcile errors [none] and the operator's resident memory [peak RSS <= 150 MB].

The cluster: etcd, kube-apiserver, kube-controller-manager and kube-scheduler as local processes,
with STATUS_NODES status-only Nodes (control_plane/status_nodes.py): the scheduler binds each pod,
its Node reports it Running and, once the garbage collector or the operator deletes it, removes
it, as a kubelet would; nothing runs. The operator is the chart's, rendered by helm and run as a
local process under its ServiceAccount's token (bench/_control_plane.py says why). A pod's
failure is the kubelet's status write, made here by the admin. Every wait is on a watch.

Many jobs at once (100 and 1,000 x 8 pods, requests by verb, steady state): bench/operator_scale.py.
The emulator's figures of this bench (docs/design/benchmarks.md) come from this file before
this change (git history); docs/design/benchmarks.md has both.
"""
from __future__ import annotations

import pathlib
import re
import statistics
import sys
import tempfile
import time
import urllib.request

from ddpjob_sandbox.jobs import make_manifest
from ddpjob_sandbox.operator_process import OperatorProcess
from ddpjob_sandbox.procs import free_port
from ddpjob_sandbox.scripted import set_terminated

from bench._control_plane import Watched, bench_cluster, chart_operator, pod_watch, rss_mb

REPEATS = 5  # warm apply measurements per size
TARGET_WARM_8_SECONDS = 0.5
TARGET_RSS_MB = 150
STATUS_NODES = 3
NAMESPACE = "bench"
WAIT_SECONDS = 120  # one job's pods on a loaded 2-core machine


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="bench-operator-") as tmp, \
            bench_cluster(pathlib.Path(tmp), STATUS_NODES) as cluster:
        metrics_port = free_port()
        k8s = cluster.namespace(NAMESPACE)
        login = chart_operator(cluster, NAMESPACE, {"watchNamespaces": [NAMESPACE], "livenessPort": free_port(),
                                                    "metrics.enabled": True, "metrics.port": metrics_port},
                               pathlib.Path(tmp))
        pods = pod_watch(k8s)
        with OperatorProcess(login, login.argv, pathlib.Path(tmp) / "operator.log") as operator:
            _time_apply(k8s, pods, "warmup", 2)  # imports, first watch events, first connections
            warm = {nodes: [_time_apply(k8s, pods, f"w{nodes}-{i}", nodes) for i in range(REPEATS)]
                    for nodes in (1, 8)}
            replace = [_time_replacement(k8s, pods, f"r{i}") for i in range(REPEATS)]
            errors = _metric(metrics_port, "ddpjob_operator_reconcile_errors_total")
            passes = _metric(metrics_port, "ddpjob_operator_reconcile_seconds_count")
            rss, peak = rss_mb(operator.process.pid)
            log_errors = sum(1 for line in operator.log().splitlines() if "[ERROR" in line or "Traceback" in line)
        pods.close()
    _print_table(warm, replace, errors, log_errors, passes, rss, peak)


def _node_pods(name: str, nodes: int) -> list[str]:
    return [f"{name}-node-{i}" for i in range(nodes)]


def _time_apply(k8s, pods: Watched, name: str, nodes: int) -> float:
    """Seconds from the create call to the moment all ``nodes`` pods exist; then deletes the job
    and waits until its pods are gone (the garbage collector, then their Node)."""
    names = _node_pods(name, nodes)
    started = time.perf_counter()
    k8s.create("ddpjobs", _job(name, nodes))
    pods.wait(lambda seen: all(n in seen for n in names), WAIT_SECONDS, f"{nodes} pods of {name}")
    elapsed = time.perf_counter() - started
    k8s.delete("ddpjobs", name)
    pods.wait(lambda seen: not any(n in seen for n in names), WAIT_SECONDS, f"the pods of {name} gone")
    return elapsed


def _time_replacement(k8s, pods: Watched, name: str) -> float:
    """Seconds from a node pod's failure (as the kubelet reports it) to its replacement's creation."""
    body = _job(name, 2)
    body["spec"]["failurePolicy"] = {"maxRestarts": 100, "backoffSeconds": 0}
    k8s.create("ddpjobs", body)
    pod = f"{name}-node-1"
    old = pods.wait(lambda seen: (p := seen.get(pod)) and (p.get("status") or {}).get("phase") == "Running" and p,
                    WAIT_SECONDS, f"{pod} Running")
    started = time.perf_counter()
    set_terminated(k8s, pod, 1)
    pods.wait(lambda seen: (p := seen.get(pod)) and p["metadata"]["uid"] != old["metadata"]["uid"], WAIT_SECONDS,
              f"a replacement of {pod}")
    elapsed = time.perf_counter() - started
    k8s.delete("ddpjobs", name)
    pods.wait(lambda seen: not any(n in seen for n in _node_pods(name, 2)), WAIT_SECONDS, f"the pods of {name} gone")
    return elapsed


def _job(name: str, nodes: int) -> dict:
    return make_manifest(name, replicas=nodes, elasticPolicy={"minReplicas": 1, "maxReplicas": 8})


def _metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    match = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def _print_table(warm, replace, errors, log_errors, passes, rss, peak) -> None:
    print(f"real control plane, {STATUS_NODES} status-only Nodes; the chart's operator", flush=True)
    rows = [("measure", "value", "target", "ok")]
    for nodes, samples in warm.items():
        median, worst = statistics.median(samples), max(samples)
        target = f"<= {TARGET_WARM_8_SECONDS} s" if nodes == 8 else ""
        ok = ("yes" if median <= TARGET_WARM_8_SECONDS else "NO") if nodes == 8 else ""
        rows.append((f"apply -> {nodes} pods (warm, median/max of {len(samples)})",
                     f"{median:.3f} s / {worst:.3f} s", target, ok))
    ratio = [w8 / w1 for w1, w8 in zip(warm[1], warm[8])]
    rows.append(("apply -> 8 pods / apply -> 1 pod (median, range)",
                 f"{statistics.median(ratio):.2f}x ({min(ratio):.2f}-{max(ratio):.2f})", "", ""))
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
