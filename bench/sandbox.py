"""Sandbox benchmark: recovery from a dead node under the operator, next to bare torchrun.

Run with ``python -m bench sandbox``. In each round, on the same machine:

* sandbox: the c10d example DDPJob (the scenario tests' test-speed copy, see
  ``ddpjob_sandbox.examples.example_job``) applied with kubectl to the real control plane
  (etcd, kube-apiserver, controller manager, scheduler as local processes), its snapshot claim
  bound by the real PV binder to a hostPath volume, the real operator creating its pods, the
  real scheduler binding them to one Node whose kubelet (control_plane/kubelets.py) runs them as
  local torchrun agents; after the snapshot at step 20 node 1 (node 0 hosts the c10d store, as
  in a cluster) is SIGKILLed as a whole (agent and workers). The operator replaces it after the
  failure policy's 1 s backoff. The operator is the chart's, rendered by helm and run as a local
  process under its ServiceAccount's token (bench/_control_plane.py says why); one Node, so one
  agent holds every pod the bench kills or reads.
* bare torchrun: two torchrun agents (``ddpjob_sandbox.torchrun.AgentGroup``) with the same
  trainer args, the same rendezvous settings (checked against the pods' PET_RDZV_CONF, and
  ``is_host=false`` on node 1 as the sandbox gives it) and the same fault: node 1's whole
  process tree SIGKILLed after step 20's snapshot. Nobody replaces it.
* bare torchrun, replaced by hand: the same, and a new node-1 agent started 1 s after the
  kill (the sandbox's backoff): what a perfect supervisor without an API server would do.

Measured: seconds from the kill to the first training step after it (timestamps from the
trainer's metrics) with that step's world size (1 when the survivor went on alone, 2 when
the replacement joined before the survivor's group re-formed), and, where a replacement
exists, seconds until the first step with two nodes again. The three configurations run in
ROUNDS rounds in rotating order; ratios are taken within each round (neighbouring runs share
the machine's load) and their median is reported with the range.

The sandbox's backoff counts from the pod's finishedAt, which (like a kubelet's) has second
precision, so its replacement may start up to 1 s sooner than the by-hand one. The emulator's
figures of this bench (docs/) come from this file before this change (git history);
docs/design/benchmarks.md has both.
"""
from __future__ import annotations

import contextlib
import os
import pathlib
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass

from ddpjob_sandbox.jobs import job_snapshot_dir
from bench._control_plane import BenchCluster, chart_operator
from bench._recovery import EVENT_TIMEOUT, event_time, first_step_after, wait_for
from ddpjob_sandbox.control_plane import running_control_plane
from ddpjob_sandbox.control_plane.cluster import make_volumes
from ddpjob_sandbox.control_plane.kubelets import running_kubelets
from ddpjob_sandbox.examples import FAST_RDZV_TIMEOUTS, example_job, kubectl_apply, trainer_args
from ddpjob_sandbox.metrics import JobProgress, MetricsWatcher, is_event
from ddpjob_sandbox.operator_process import OperatorProcess
from ddpjob_sandbox.procs import free_port, holds_socket, listening_socket_inodes
from ddpjob_sandbox.torchrun import AgentGroup, Rendezvous, unique_run_id

ROUNDS = int(os.environ.get("BENCH_SANDBOX_ROUNDS", "3"))  # one round is ~3 minutes here
KILL_AFTER_STEP = 20  # the kill follows the snapshot at this step
BACKOFF_SECONDS = 1  # example_job's failurePolicy.backoffSeconds: the sandbox's replacement delay
NAMESPACE = "bench-sandbox"
NODE = "bench-node"  # the one Node (4 CPUs): the job's two pods request 1 CPU each, and a replacement
# Long enough that training still runs well after the kill, the resume and the replacement.
ARGS = trainer_args(epochs=30, samples=2048, step_sleep=0.1, snapshot_every_steps=10)
# The rendezvous settings the operator renders from FAST_RDZV_TIMEOUTS (closeSeconds keeps its default).
RDZV_CONF = {"join_timeout": str(FAST_RDZV_TIMEOUTS["joinSeconds"]),
             "last_call_timeout": str(FAST_RDZV_TIMEOUTS["lastCallSeconds"]), "close_timeout": "30",
             "keep_alive_interval": str(FAST_RDZV_TIMEOUTS["keepAliveIntervalSeconds"]),
             "keep_alive_max_attempt": str(FAST_RDZV_TIMEOUTS["keepAliveMaxAttempts"])}


@dataclass
class Recovery:
    """One measured fault: kill -> first resumed step (and -> full world size again, sandbox only)."""

    seconds: float
    world_size: int
    full_world_seconds: float | None = None


def conf_of(text: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in text.split(",") if item)


class Sandbox:
    """The real control plane, one kubelet, the operator, warm across rounds (one job per round)."""

    def __init__(self, workdir: pathlib.Path, rounds: int = ROUNDS):
        self.workdir, self.rounds = workdir, rounds

    def __enter__(self) -> "Sandbox":
        self._stack = contextlib.ExitStack()
        try:
            control_plane = self._stack.enter_context(running_control_plane(self.workdir / "control-plane"))
            (kubelet,) = self._stack.enter_context(running_kubelets(
                control_plane.layout.pki, control_plane.url, self.workdir / "kubelets", [NODE], poll_seconds=0.2))
            self.agent = kubelet.agent
            cluster = BenchCluster(control_plane)
            self.k8s = cluster.namespace(NAMESPACE)
            # One volume per round: a released hostPath volume (Retain) is not bound again.
            make_volumes(self.k8s, self.workdir / "volumes", count=self.rounds + 1, prefix=f"{NAMESPACE}-pv")
            login = chart_operator(cluster, NAMESPACE, {"watchNamespaces": [NAMESPACE], "livenessPort": free_port()},
                                   self.workdir)
            self.operator = OperatorProcess(login, login.argv, self.workdir / "operator.log").start()
            self._stack.callback(self.operator.stop)
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()

    def claim(self, name: str) -> pathlib.Path:
        """Creates claim ``name`` as snapshot-pvc.yaml's (no storage class: a hostPath volume of the
        bench's) and returns the directory the PV binder bound it to."""
        self.k8s.create("persistentvolumeclaims", {"metadata": {"name": name}, "spec": {
            "accessModes": ["ReadWriteMany"], "storageClassName": "", "resources": {"requests": {"storage": "1Gi"}}}})
        volume = wait_for(lambda: (self.k8s.get("persistentvolumeclaims", name).get("spec") or {}).get("volumeName"),
                          f"claim {name} bound", timeout=60)
        return pathlib.Path(self.k8s.get("persistentvolumes", volume)["spec"]["hostPath"]["path"])

    def recovery(self, round_: int) -> Recovery:
        name, port = f"mlp-{round_}", free_port()
        body = example_job(args=ARGS, rdzv_port=port, backoff_seconds=BACKOFF_SECONDS)
        body["metadata"]["name"] = name
        # The store on node 0, as the bare agents' node 0 hosts it (the example now puts it in a
        # pod of its own, whose node-0 is_host=false no bare agent matches).
        body["spec"]["elasticPolicy"]["rdzvStore"] = "node"
        body["spec"]["snapshot"]["volume"]["persistentVolumeClaim"]["claimName"] = f"{name}-snapshots"
        snapshots = self.claim(f"{name}-snapshots")
        kubectl_apply(self.k8s, body, self.workdir)
        progress = JobProgress(self.k8s, self.agent, name, job_snapshot_dir(snapshots, name) / "metrics.jsonl")
        try:
            progress.wait(is_event("start", world_size=2), EVENT_TIMEOUT, "both nodes training")
            pod_conf = conf_of(self._env(f"{name}-node-0")["PET_RDZV_CONF"])
            # The operator says is_host=true on node 0; the bare node-0 agent hosts by its address (the default).
            expected = {**RDZV_CONF, "is_host": "true"}
            assert pod_conf == expected, f"node 0's PET_RDZV_CONF {pod_conf} is not the bare agents' {expected}"
            progress.wait(is_event("snapshot", step=KILL_AFTER_STEP), EVENT_TIMEOUT, "the snapshot before the kill")
            host = self.agent.pod_listening_on(port)
            assert host == f"{name}-node-0", f"the c10d store is hosted by {host}, not node 0"
            victim = f"{name}-node-1"
            killed_at = time.time()
            self.agent.kill(victim)
            first = wait_for(lambda: first_step_after(progress.metrics_path, killed_at), "the first resumed step")
            full = wait_for(lambda: first_step_after(progress.metrics_path, killed_at, world_size=2),
                            "a step with the replacement")
            return Recovery(event_time(first) - killed_at, first["world_size"], event_time(full) - killed_at)
        finally:
            self.k8s.kubectl("delete", "ddpjob", name, "--wait=false")
            wait_for(lambda: not self.k8s.list("pods"), "the job's pods gone", timeout=60)

    def _env(self, pod: str) -> dict[str, str]:
        return {e["name"]: e.get("value", "") for e in self.k8s.get("pods", pod)["spec"]["containers"][0]["env"]}


def torchrun_recovery(workdir: pathlib.Path, replace_after: float | None = None) -> Recovery:
    """Two bare torchrun agents; node 1 killed as a whole after the snapshot at step 20 and,
    with ``replace_after``, a new node-1 agent started that many seconds after the kill."""
    snapshots = workdir / "snapshots"
    target = ["-m", "ddpjob_trainer.examples.mlp", *ARGS, "--snapshot-dir", str(snapshots)]
    rdzv = Rendezvous("c10d", f"127.0.0.1:{free_port()}", unique_run_id(), "1:4", dict(RDZV_CONF))
    port = int(rdzv.endpoint.rsplit(":", 1)[1])
    metrics = snapshots / "metrics.jsonl"
    with AgentGroup(workdir, rdzv, target, max_restarts=3) as group:
        host = group.start("node0")
        victim = group.start("node1", rdzv_conf_extra={"is_host": False})
        watcher = MetricsWatcher(metrics, group)
        watcher.wait(is_event("start", world_size=2), EVENT_TIMEOUT, "both agents training")
        watcher.wait(is_event("snapshot", step=KILL_AFTER_STEP), EVENT_TIMEOUT, "the snapshot before the kill")
        assert holds_socket(host.pid, listening_socket_inodes(port)), "node 0 does not host the c10d store"
        killed_at = time.time()
        victim.kill()
        if replace_after is not None:
            time.sleep(replace_after)
            group.start("node1-replacement", rdzv_conf_extra={"is_host": False})
        first = wait_for(lambda: first_step_after(metrics, killed_at), "the first resumed step")
        full = None
        if replace_after is not None:
            full = event_time(wait_for(lambda: first_step_after(metrics, killed_at, world_size=2),
                                       "a step with the replacement")) - killed_at
    return Recovery(event_time(first) - killed_at, first["world_size"], full)


CONFIGS = ("sandbox", "torchrun", "torchrun+replacement")


def main() -> None:
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-sandbox-") as tmp, Sandbox(pathlib.Path(tmp)) as sandbox:
        for round_ in range(ROUNDS):
            order = CONFIGS[round_ % 3:] + CONFIGS[:round_ % 3]
            row = {}
            for kind in order:
                workdir = pathlib.Path(tmp) / f"{kind}-{round_}"
                workdir.mkdir()
                if kind == "sandbox":
                    row[kind] = sandbox.recovery(round_)
                else:
                    row[kind] = torchrun_recovery(workdir, BACKOFF_SECONDS if kind.endswith("replacement") else None)
            rows.append(row)
            print(f"round {round_ + 1}: " + "; ".join(f"{kind} {_describe(row[kind])}" for kind in CONFIGS), flush=True)
    _print_table(rows)


def _describe(r: Recovery) -> str:
    full = f", two nodes again after {r.full_world_seconds:.2f} s" if r.full_world_seconds is not None else ""
    return f"{r.seconds:.2f} s (world size {r.world_size}{full})"


def _ratio(rows: list[dict[str, Recovery]], field: str, base: str) -> str:
    ratios = [getattr(row["sandbox"], field) / getattr(row[base], field) for row in rows]
    return f"{statistics.median(ratios):.2f}x (range {min(ratios):.2f}-{max(ratios):.2f})"


def _print_table(rows: list[dict[str, Recovery]]) -> None:
    def median(kind: str, field: str) -> str:
        return f"{statistics.median(getattr(row[kind], field) for row in rows):.2f} s"

    print()
    print(f"| median of {len(rows)} rounds | sandbox (operator + node agent) | bare torchrun | "
          "bare torchrun, replaced by hand after 1 s | sandbox / bare | sandbox / replaced by hand |")
    print("|---|---|---|---|---|---|")
    print(f"| kill of node 1 -> first resumed step | {median('sandbox', 'seconds')} | {median('torchrun', 'seconds')} "
          f"| {median('torchrun+replacement', 'seconds')} | {_ratio(rows, 'seconds', 'torchrun')} "
          f"| {_ratio(rows, 'seconds', 'torchrun+replacement')} |")
    print(f"| kill of node 1 -> first step with two nodes | {median('sandbox', 'full_world_seconds')} | (never) "
          f"| {median('torchrun+replacement', 'full_world_seconds')} | - "
          f"| {_ratio(rows, 'full_world_seconds', 'torchrun+replacement')} |")


if __name__ == "__main__":
    sys.exit(main())
