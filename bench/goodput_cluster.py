"""Goodput on the real control plane: wall time lost per node SIGKILL, in the sandbox, next to bare torchrun.

Run with ``python -m bench goodput_cluster``. The figures of ``bench goodput`` (which runs the
example under ``ddpjob run``), measured where the operator decides instead: the example DDPJob
(manifests/examples/ddpjob-c10d.yaml, its own training schedule and failure policy, with the
rendezvous timeouts ``ddpjob run`` uses, ``ddpjob_sandbox.examples.FAST_RDZV_TIMEOUTS``) applied
to the real control plane (etcd, kube-apiserver, controller manager, scheduler as local processes)
with the chart's operator, its pods bound by the real scheduler to one Node whose kubelet runs
them as local processes (bench/sandbox.py's ``Sandbox``). Each round runs, one after the other:

* the job, clean, and with one training node pod's whole process tree SIGKILLed KILL_AFTER s
  after the first step (the pod exits 137: a failure incident, judged by the operator);
* the same two with one warm spare (``spareReplicas: 1``, ``maxReplicas: 2``), the kill once the
  status counts the spare waiting, its victim a pod that trains (the rendezvous, not the index,
  picks the spare: ``ddpjob_sandbox.metrics.trains``);
* bare torchrun, clean and with the same kill, replaced by hand after the spec's backoff
  (``bench.goodput.torchrun_wall``, unchanged: the reference of ``bench goodput``).

Wall time lost per kill is the 1-kill run's minus the clean run's, each way. A sandbox run's time
is its training's: the trainer's first step to its last (metrics.jsonl), which leaves out the
pods' scheduling and start, the same with and without a kill; bare torchrun's is its processes'
wall time, as in ``bench goodput``. ``BENCH_GOODPUT_CLUSTER_ROUNDS`` (default 2) repeats the six
runs; the ratios are taken per round (neighbouring runs share the machine's load) and printed as
median and range. One round takes ~5 minutes on the 2-core machine.
"""
from __future__ import annotations

import os
import pathlib
import statistics
import tempfile
import time
from dataclasses import dataclass

from bench._recovery import EVENT_TIMEOUT, event_time, first_step_after, wait_for
from bench.goodput import KILL_AFTER, NODES, RUN_TIMEOUT, _pauses, _reduced, torchrun_wall
from bench.sandbox import Sandbox
from ddpjob_sandbox.examples import example_job, kubectl_apply, load_example
from ddpjob_sandbox.jobs import job_snapshot_dir
from ddpjob_sandbox.metrics import JobProgress, is_event, trains
from ddpjob_sandbox.procs import free_port
from ddpjob_trainer.report.metrics import read_metrics, read_raw_metrics

ROUNDS = int(os.environ.get("BENCH_GOODPUT_CLUSTER_ROUNDS", "2"))
JOBS_PER_ROUND = 4  # clean and 1-kill, without and with a spare: one snapshot volume each
BACKOFF_SECONDS = load_example()["spec"]["failurePolicy"]["backoffSeconds"]  # the example's own


@dataclass(frozen=True)
class ClusterRun:
    """One sandbox run of the example job."""

    spares: int
    killed: bool
    span: float  # the trainer's first step to its last, seconds
    redone: int  # steps trained twice (raw steps minus the effective history's)
    pauses: list[float]  # gaps of over bench.goodput.PAUSE s between steps after the kill
    reduced: int  # steps at world size < NODES after the kill
    full_size: float | None  # kill -> first step with NODES nodes again
    restarts: int  # status.restarts: failure incidents the operator counted
    load: float


def main() -> None:
    rounds = []
    with tempfile.TemporaryDirectory(prefix="bench-goodput-cluster-") as tmp, \
            Sandbox(pathlib.Path(tmp), rounds=ROUNDS * JOBS_PER_ROUND) as sandbox:
        for round_ in range(ROUNDS):
            runs = {}
            for spares in (0, 1):
                for killed in (False, True):
                    name = f"mlp-{round_}-{spares}-{int(killed)}"
                    runs[spares, killed] = run_job(sandbox, name, spares, killed)
                    print(f"round {round_ + 1}: {name}: {runs[spares, killed]}", flush=True)
            bare = {}
            for kills in (0, 1):
                workdir = pathlib.Path(tmp) / f"torchrun-{round_}-{kills}"
                workdir.mkdir()
                bare[kills] = torchrun_wall(workdir, kills)
                print(f"round {round_ + 1}: bare torchrun with {kills} kill(s): wall {bare[kills]:.1f} s", flush=True)
            rounds.append((runs, bare))
    _print(rounds)


def run_job(sandbox: Sandbox, name: str, spares: int, killed: bool) -> ClusterRun:
    """The example job in the sandbox until it succeeds, with one training pod SIGKILLed
    KILL_AFTER s after the first step when ``killed``."""
    body = example_job(args=load_example()["spec"]["args"], rdzv_port=free_port(), backoff_seconds=BACKOFF_SECONDS)
    body["metadata"]["name"] = name
    body["spec"]["snapshot"]["volume"]["persistentVolumeClaim"]["claimName"] = f"{name}-snapshots"
    if spares:
        body["spec"]["elasticPolicy"].update(maxReplicas=body["spec"]["replicas"], spareReplicas=spares)
    metrics = job_snapshot_dir(sandbox.claim(f"{name}-snapshots"), name) / "metrics.jsonl"
    kubectl_apply(sandbox.k8s, body, sandbox.workdir)
    progress = JobProgress(sandbox.k8s, sandbox.agent, name, metrics)
    try:
        first = progress.wait(is_event("step"), EVENT_TIMEOUT, "the first step")
        killed_at = _kill(sandbox, progress, name, spares, event_time(first)) if killed else None
        status = progress.wait_phase("Succeeded", RUN_TIMEOUT)
    finally:
        sandbox.k8s.kubectl("delete", "ddpjob", name, "--wait=false")
        wait_for(lambda: not sandbox.k8s.list("pods"), "the job's pods gone", timeout=60)
    raw, effective = read_raw_metrics(metrics), read_metrics(metrics)
    steps = [event_time(e) for e in raw if e["event"] == "step"]
    full = first_step_after(metrics, killed_at, NODES) if killed_at else None
    return ClusterRun(spares, killed, round(steps[-1] - steps[0], 1),
                      len(steps) - sum(1 for e in effective if e["event"] == "step"),
                      _pauses(raw, killed_at) if killed_at else [], _reduced(raw, killed_at) if killed_at else 0,
                      round(event_time(full) - killed_at, 1) if full else None, int(status.get("restarts") or 0),
                      round(os.getloadavg()[0], 1))


def _kill(sandbox: Sandbox, progress: JobProgress, name: str, spares: int, first_step: float) -> float:
    """SIGKILLs a training node pod's processes KILL_AFTER s after the first step (with spares, once
    the status counts them waiting); returns the moment of the kill."""
    pods = [f"{name}-node-{i}" for i in range(NODES + spares)]
    if spares:
        wait_for(lambda: progress.status().get("spares") == spares, "the spare waiting", timeout=EVENT_TIMEOUT)
    victim = wait_for(lambda: [p for p in pods if trains(sandbox.k8s, p)][-1:] or None, "a training pod")[0]
    time.sleep(max(0.0, first_step + KILL_AFTER - time.time()))
    killed_at = time.time()
    sandbox.agent.kill(victim)
    return killed_at


def _print(rounds: list[tuple[dict, dict]]) -> None:
    print("\nwall time lost per node SIGKILL on the real control plane (1-kill run minus the clean run), "
          "side by side per round:")
    print("| round | sandbox, no spare | sandbox, 1 spare | bare torchrun | no spare / bare | spare / bare "
          "| pauses, no spare / spare | kill -> full size, no spare / spare | steps at reduced size | redone "
          "| incidents counted |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    lost = {"without": [], "spares": [], "bare": []}
    for i, (runs, bare) in enumerate(rounds, 1):
        without, spared = (runs[s, True].span - runs[s, False].span for s in (0, 1))
        for name, value in (("without", without), ("spares", spared), ("bare", bare[1] - bare[0])):
            lost[name].append(value)
        k0, k1 = runs[0, True], runs[1, True]
        print(f"| {i} | {without:.1f} s | {spared:.1f} s | {bare[1] - bare[0]:.1f} s | {without / lost['bare'][-1]:.2f}x "
              f"| {spared / lost['bare'][-1]:.2f}x | {_seconds(k0.pauses)} / {_seconds(k1.pauses)} "
              f"| {k0.full_size} s / {k1.full_size} s | {k0.reduced} / {k1.reduced} | {k0.redone} / {k1.redone} "
              f"| {k0.restarts} / {k1.restarts} |")
    for name, values in lost.items():
        print(f"{name}: lost per kill median {statistics.median(values):.1f} s [{min(values):.1f} .. {max(values):.1f}]")
    for name, target in (("without", 0.3), ("spares", 0.2)):
        ratios = [a / b for a, b in zip(lost[name], lost["bare"])]
        print(f"{name} / bare torchrun: median {statistics.median(ratios):.2f}x [{min(ratios):.2f} .. "
              f"{max(ratios):.2f}] (target <= {target}x), {len(ratios)} round(s)")


def _seconds(values: list[float]) -> str:
    return ", ".join(f"{v:.1f} s" for v in values) or "-"


if __name__ == "__main__":
    main()
