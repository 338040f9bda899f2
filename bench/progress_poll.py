"""Progress poll benchmark: the operator's memory while it polls hostile pods, next to benign ones.

One real control plane (etcd, kube-apiserver, controller manager, scheduler as local processes)
with a status-only Node (control_plane/status_nodes.py), which reports every pod bound to it
Running at the address of the kind's fake pod. For each kind of pod a fresh namespace and a fresh
operator (the chart rendered by helm, run as a local process under its ServiceAccount's token,
polling every POLL_SECONDS: bench/_control_plane.py says why) runs one job of one node whose pod
IP is a fake pod (tests/support/fake_pods.py) on the progress port the pod names, answering:

* benign: a valid progress record;
* bomb: a 298 KiB gzip body that expands to 300 MiB, declared ``Content-Encoding: gzip``;
* huge: 400 MiB of body with no Content-Length (it ends when the connection does);
* redirect: a 302 to another fake pod that serves a valid record;
* trickle: a valid record, one byte every 50 ms.

Measured per kind, after POLLS polls: the operator's resident memory once it is ready, before
the job is created (a pod's address is set once, at its Running report, so there is no moment
between the job's first pass and the first poll), and after the last poll (VmRSS) and its peak
(VmHWM), as growth over the "before" figure
[target: under 20 MB for every kind]; the body bytes the pod got out per poll (what the
operator took, plus what its socket buffer held unread); the longest exchange as the pod saw
it; and whether a redirect target was ever asked. Figures only: nothing here is asserted.

``BENCH_OPERATOR_SRC=/path/to/checkout python -m bench progress_poll`` runs the operator of
another checkout (e.g. one before the poll was hardened) for comparison. The emulator's figures
(docs/) come from this file before this change (git history); docs/design/benchmarks.md has both.
"""
from __future__ import annotations

import os
import pathlib
import sys
import tempfile
import time
import urllib.request

from ddpjob_operator.api import constants as C

from bench._control_plane import bench_cluster, chart_operator, rss_mb
from ddpjob_sandbox.jobs import make_manifest
from ddpjob_sandbox.operator_process import OperatorProcess
from ddpjob_sandbox.pod_status import progress_message
from ddpjob_sandbox.procs import free_port
from ddpjob_sandbox.readers import status
from tests.support.fake_pods import FakePod, gzip_bomb, huge_body, record_answer, redirect, trickle

POLLS = 6  # polls per kind
POLL_SECONDS = 0.2  # --progress-poll-seconds
TARGET_GROWTH_MB = 20
MIB = 1 << 20
VALID = progress_message(40, snapshot_time="2026-11-23T01:00:40Z")
KINDS = ("benign", "bomb", "huge", "redirect", "trickle")


def main() -> None:
    source = os.environ.get("BENCH_OPERATOR_SRC")
    env = {"PYTHONPATH": f"{source}/operator:{source}/rdzv"} if source else {}
    print(f"operator from {source or 'this checkout'}; {POLLS} polls per kind, every {POLL_SECONDS} s", flush=True)
    rows = []
    address = {"ip": ""}  # the address the status-only Node reports for the next pod: the kind's fake pod
    with tempfile.TemporaryDirectory(prefix="bench-poll-") as tmp, \
            bench_cluster(pathlib.Path(tmp), 1, pod_ip=lambda pod: address["ip"]) as cluster:
        for kind in KINDS:
            rows.append(_measure(cluster, pathlib.Path(tmp), kind, env, address))
    _print_table(rows)


def _answers(kind: str, target: FakePod):
    return {"benign": lambda: record_answer(VALID), "bomb": lambda: gzip_bomb(300),
            "huge": lambda: huge_body(400 * MIB, declared=False), "redirect": lambda: redirect(target.url),
            "trickle": lambda: trickle(VALID, every=0.05)}[kind]()


def _measure(cluster, tmp: pathlib.Path, kind: str, env: dict[str, str], address: dict[str, str]) -> dict:
    namespace = f"poll-{kind}"
    k8s = cluster.namespace(namespace)
    login = chart_operator(cluster, namespace, {"watchNamespaces": [namespace], "livenessPort": free_port(),
                                                "progressPollSeconds": POLL_SECONDS}, tmp)
    with FakePod(record_answer(VALID), port=C.PROGRESS_PORT) as target, \
            FakePod(_answers(kind, target), port=C.PROGRESS_PORT) as fake, \
            OperatorProcess(login, login.argv, tmp / f"operator-{kind}.log", env=env) as operator:
        # Ready: its liveness port answers once kopf runs (then the operator's memory is settled).
        _wait_ready(operator, login.argv)
        before, _ = rss_mb(operator.process.pid)
        address["ip"] = fake.ip
        k8s.create("ddpjobs", make_manifest(replicas=1))
        k8s.wait_for(lambda: status(k8s).get("phase") == "Running", timeout=120, interval=0.5, what="phase Running")
        exchanges = fake.finished(POLLS, timeout=POLLS * 10)
        after, peak = rss_mb(operator.process.pid)
    return {"kind": kind, "polls": len(exchanges), "before": before, "after": after, "peak": peak,
            "sent": max((e.sent for e in exchanges), default=0),
            "longest": max((e.seconds for e in exchanges), default=0.0),
            "followed": len(target.exchanges)}


def _wait_ready(operator: OperatorProcess, argv: list[str], timeout: float = 120) -> None:
    port = next(a.split("=", 1)[1] for a in argv if a.startswith("--liveness-port="))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        if operator.process.poll() is not None:
            break
        time.sleep(0.5)
    raise RuntimeError(f"the operator was not ready within {timeout:.0f} s; its log ends:\n{operator.log()[-3000:]}")


def _size(count: int) -> str:
    if count < 10 * 1024:
        return f"{count} B"
    return f"{count / 1024:.0f} KiB" if count < 10 * MIB else f"{count / MIB:.0f} MiB"


def _print_table(rows: list[dict]) -> None:
    table = [("pod", "polls", "RSS before", "after", "growth", "peak growth", "body out/poll", "longest",
              "redirect followed", f"growth < {TARGET_GROWTH_MB} MB")]
    for r in rows:
        growth, peak_growth = r["after"] - r["before"], max(r["peak"] - r["before"], 0.0)
        table.append((r["kind"], str(r["polls"]), f"{r['before']:.1f} MB", f"{r['after']:.1f} MB", f"{growth:+.1f} MB",
                      f"{peak_growth:+.1f} MB", _size(r["sent"]), f"{r['longest']:.2f} s",
                      "yes" if r["followed"] else "no",
                      "yes" if max(growth, peak_growth) < TARGET_GROWTH_MB else "NO"))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip(), flush=True)


if __name__ == "__main__":
    sys.exit(main())
