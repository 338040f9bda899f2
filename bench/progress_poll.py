"""Progress poll benchmark: the operator's memory while it polls hostile pods, next to benign ones.

For each kind of pod a fresh operator process (``python -m ddpjob_operator``, over the
test-side API emulator, polling every POLL_SECONDS) runs one job of one node whose pod IP
is a fake pod (tests/support/fake_pods.py) answering:

* benign: a valid progress record;
* bomb: a 298 KiB gzip body that expands to 300 MiB, declared ``Content-Encoding: gzip``;
* huge: 400 MiB of body with no Content-Length (it ends when the connection does);
* redirect: a 302 to another fake pod that serves a valid record;
* trickle: a valid record, one byte every 50 ms.

Measured per kind, after POLLS polls: the operator's resident memory just before the first
poll and after the last (VmRSS) and its peak (VmHWM), as growth over the "before" figure
[target: under 20 MB for every kind]; the body bytes the pod got out per poll (what the
operator took, plus what its socket buffer held unread); the longest exchange as the pod saw
it; and whether a redirect target was ever asked. Figures only: nothing here is asserted.

``BENCH_OPERATOR_SRC=/path/to/checkout python -m bench progress_poll`` runs the operator of
another checkout (e.g. one before the poll was hardened) for comparison.
"""
from __future__ import annotations

import os
import pathlib
import sys
import tempfile
import time

from tests.support.fake_pods import FakePod, gzip_bomb, huge_body, record_answer, redirect, trickle
from ddpjob_sandbox.jobs import make_manifest
from ddpjob_sandbox.readers import pod_names, status
from ddpjob_sandbox.pod_status import progress_message
from ddpjob_sandbox.scripted import set_running
from ddpjob_sandbox.operator_process import OperatorProcess, operator_command
from ddpjob_sandbox.cluster import running_cluster

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
    with tempfile.TemporaryDirectory() as tmp, running_cluster(pathlib.Path(tmp)) as cluster:
        for kind in KINDS:
            rows.append(_measure(cluster, pathlib.Path(tmp), kind, env))
    _print_table(rows)


def _answers(kind: str, target: FakePod):
    return {"benign": lambda: record_answer(VALID), "bomb": lambda: gzip_bomb(300),
            "huge": lambda: huge_body(400 * MIB, declared=False), "redirect": lambda: redirect(target.url),
            "trickle": lambda: trickle(VALID, every=0.05)}[kind]()


def _measure(cluster, tmp: pathlib.Path, kind: str, env: dict[str, str]) -> dict:
    k8s = cluster.client(f"poll-{kind}")
    command = operator_command(k8s.namespace, "--progress-poll-seconds", str(POLL_SECONDS))
    with FakePod(record_answer(VALID)) as target, FakePod(_answers(kind, target)) as fake, \
            OperatorProcess(cluster, command, tmp / f"operator-{kind}.log", env=env) as operator:
        k8s.create("ddpjobs", make_manifest(replicas=1))
        k8s.wait_for(lambda: pod_names(k8s) == ["mlp-node-0"], timeout=60, what="the node pod")
        set_running(k8s, "mlp-node-0")
        k8s.wait_for(lambda: status(k8s).get("phase") == "Running", timeout=60, what="phase Running")
        time.sleep(1.0)  # the passes the pod events started are over
        before, _ = _rss_mb(operator.process.pid)
        _point_at(k8s, "mlp-node-0", fake)
        exchanges = fake.finished(POLLS, timeout=POLLS * 10)
        after, peak = _rss_mb(operator.process.pid)
    return {"kind": kind, "polls": len(exchanges), "before": before, "after": after, "peak": peak,
            "sent": max((e.sent for e in exchanges), default=0),
            "longest": max((e.seconds for e in exchanges), default=0.0),
            "followed": len(target.exchanges)}


def _point_at(k8s, name: str, fake: FakePod) -> None:
    """The pod's IP and progress port become the fake pod's (see test_live_progress.point_at)."""
    containers = k8s.get("pods", name)["spec"]["containers"]
    for port in containers[0]["ports"]:
        if port["name"] == "progress":
            port["containerPort"] = fake.port
    k8s.patch("pods", name, {"spec": {"containers": containers}})
    k8s.patch("pods", name, {"status": {"podIP": fake.ip}}, subresource="status")


def _rss_mb(pid: int) -> tuple[float, float]:
    """Current and peak resident set size of ``pid`` in MB (from /proc)."""
    fields = dict(line.split(":", 1) for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines()
                  if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


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
