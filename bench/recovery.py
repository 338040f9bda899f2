"""Where a node-loss recovery spends its time: `ddpjob run`, the sandbox and bare torchrun, part by part.

Run with ``python -m bench recovery`` (``BENCH_RECOVERY_ROUNDS``, default 1; a round is ~3 min
here). Each round runs the same job three ways, one after the other: under ``ddpjob run``
(its CLI), in the sandbox (bench/sandbox.py's: the real operator on the real control plane,
one kubelet running the pods) and as two bare torchrun agents. All three use the example DDPJob with the sandbox
tests' speed-ups (``ddpjob_sandbox.examples.example_job``: FAST_RDZV_TIMEOUTS, 1 s backoff),
the c10d store on node 0 (``rdzvStore: node``, as the bare agents' ``is_host``) and the same
fault: node 1's whole process tree SIGKILLed right after the snapshot at step KILL_AFTER_STEP.

The parts, each measured from the kill, on the survivor (node 0):
  notice        its agent reports the worker group failed (the worker died of the lost peer), or
                restarts it because the lost node's liveness beacon closed (rendezvous/notice.py)
  stopped       its agent stopped its workers and begins the next round ("Rendezvous'ing worker group")
  rendezvous    its agent logs "Rendezvous complete" for the next round (LOGLEVEL=INFO)
  process       its new worker process started (/proc, written by ddpjob_trainer.marks)
  imports       the worker finished importing torch (ddpjob_trainer.dist, marks)
  group         init_process_group returned (marks)
  snapshot      the trainer's "start" metric: snapshot loaded, model wrapped
  first step    the first step after it (bench._recovery.first_step_after)
The marks are on only with DDPJOB_RECOVERY_MARKS (set here in spec.env / the agents' env).
"""
from __future__ import annotations

import datetime
import json
import os
import pathlib
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from bench._recovery import EVENT_TIMEOUT, event_time, first_step_after, interrupt_ddpjob_run, wait_for
from bench.sandbox import RDZV_CONF, Sandbox
from ddpjob_operator.local.procs import kill_marked_until_gone
from ddpjob_sandbox.jobs import job_snapshot_dir
from ddpjob_sandbox.examples import example_job, kubectl_apply, trainer_args, write_manifest
from ddpjob_sandbox.metrics import JobProgress, MetricsWatcher, is_event, read_events
from ddpjob_sandbox.procs import free_port
from ddpjob_sandbox.torchrun import AgentGroup, Rendezvous, unique_run_id
from ddpjob_trainer.marks import MARKS_ENV

ROUNDS = int(os.environ.get("BENCH_RECOVERY_ROUNDS", "1"))
KILL_AFTER_STEP = 20
BACKOFF_SECONDS = 1  # example_job's failurePolicy.backoffSeconds
ARGS = trainer_args(epochs=30, samples=2048, step_sleep=0.1, snapshot_every_steps=10)
DDPJOB = pathlib.Path(sys.executable).parent / "ddpjob"
PARTS = ("notice", "stopped", "rendezvous", "process", "imports", "group", "snapshot", "first step")
CONFIGS = ("ddpjob run", "sandbox", "torchrun")
# torch's elastic log lines: "I1124 04:23:15.511000 11533 torch/distributed/...py:1002] message"
TORCH_LOG = re.compile(r"^[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d\.\d+) \d+ \S+\] (.*)$")
# The survivor's agent learns of the loss: its worker failed on the lost peer, or (ddpjob-c10d,
# etcd-v3) the lost node's beacon closed and the handler answered num_nodes_waiting (notice.py),
# which torch logs as "Detected 1 new nodes from group_rank=..." in the same monitor tick.
NOTICE = ("failed (exitcode", "Worker group FAILED", "Worker group UNHEALTHY", "new nodes from group_rank")


def job_body(name: str, port: int, marks: pathlib.Path) -> dict:
    body = example_job(args=ARGS, rdzv_port=port, backoff_seconds=BACKOFF_SECONDS)
    body["metadata"]["name"] = name
    spec = body["spec"]
    spec["elasticPolicy"]["rdzvStore"] = "node"
    spec["env"] = [*spec.get("env", []), {"name": MARKS_ENV, "value": str(marks)}, {"name": "LOGLEVEL", "value": "INFO"}]
    return body


def agent_times(log: pathlib.Path, after: float) -> dict[str, float]:
    """notice, stopped and rendezvous times (epoch seconds) from a torchrun agent's log, the first after `after`."""
    year = datetime.date.today().year
    found: dict[str, float] = {}
    for line in log.read_text(errors="replace").splitlines():
        match = TORCH_LOG.match(line.strip())
        if not match:
            continue
        month, day, hour, minute, second, text = match.groups()
        moment = datetime.datetime(year, int(month), int(day), int(hour), int(minute)).timestamp() + float(second)
        if moment <= after:
            continue
        if "notice" not in found and any(needle in text for needle in NOTICE):
            found["notice"] = moment
        if "notice" in found and "stopped" not in found and "Rendezvous'ing worker group" in text:
            found["stopped"] = moment
        if "notice" in found and "rendezvous" not in found and "Rendezvous complete" in text:
            found["rendezvous"] = moment
    return found


def worker_marks(marks: pathlib.Path, after: float) -> dict[str, float]:
    """The marks of the first worker process started after `after` (the survivor's restart).

    Only a worker has a RANK: a node's fork server (fastRestart) imports ddpjob_trainer.dist
    too, in the agent's environment, and its marks are not a worker's start."""
    events = [e for e in read_events(marks) if e.get("rank") is not None]
    started = sorted((e["time"], e["pid"]) for e in events if e["mark"] == "process_started" and e["time"] > after)
    if not started:
        return {}
    pid = started[0][1]
    names = {"process_started": "process", "imports_done": "imports", "process_group": "group"}
    return {names[e["mark"]]: e["time"] for e in events if e["pid"] == pid and e["mark"] in names}


def breakdown(killed_at: float, agent_log: pathlib.Path, marks: pathlib.Path, metrics: pathlib.Path) -> dict:
    """Seconds from the kill to each part (None where a part left no trace)."""
    times = {**agent_times(agent_log, killed_at), **worker_marks(marks, killed_at)}
    first = first_step_after(metrics, killed_at)
    start = next((e for e in read_events(metrics) if e["event"] == "start" and event_time(e) > killed_at), None)
    if start:
        times["snapshot"] = event_time(start)
    if first:
        times["first step"] = event_time(first)
        times["world size"] = first["world_size"]
    parts = {part: (round(times[part] - killed_at, 2) if part in times else None) for part in PARTS}
    parts["world size"] = times.get("world size")
    return parts


def ddpjob_run(workdir: pathlib.Path) -> dict:
    """`ddpjob run` of the job; node 1's tree SIGKILLed after the snapshot at KILL_AFTER_STEP."""
    marks, run_dir = workdir / "marks.jsonl", workdir / "run"
    job = write_manifest(job_body("mlp", free_port(), marks), workdir / "job.yaml")
    argv = [str(DDPJOB), "run", str(job), "--workdir", str(run_dir), "--port", "0", "--plain", "--spec-rdzv-timeouts"]
    with open(workdir / "ddpjob.out", "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    metrics = run_dir / "snapshots" / "metrics.jsonl"
    try:
        wait_for(lambda: _has(metrics, "snapshot", KILL_AFTER_STEP), "the snapshot before the kill")
        node = [e for e in _events(run_dir) if e["event"] == "started" and e["node"] == 1][-1]
        killed_at = time.time()
        os.killpg(node["pid"], signal.SIGKILL)  # the node's agent, then its workers: the runner's own marker
        kill_marked_until_gone(f"{node['rdzv_id']}.node-1.{node['start']}")
        wait_for(lambda: first_step_after(metrics, killed_at), "the first resumed step")
        return breakdown(killed_at, run_dir / "logs" / "node-0.log", marks, metrics)
    finally:
        if not interrupt_ddpjob_run(proc, run_dir, timeout=60):  # as Ctrl-C: ddpjob stops every node
            # A Ctrl-C that does not stop the run is a bug of `ddpjob run`: keep its evidence
            # (the run directory goes with the bench's temporary directory).
            kept = pathlib.Path(tempfile.mkdtemp(prefix="bench-recovery-stuck-"))
            shutil.copytree(workdir, kept / workdir.name, dirs_exist_ok=True)
            raise RuntimeError(f"ddpjob run did not stop within 60 s of Ctrl-C; its files: {kept}") from None


def sandbox_run(sandbox: Sandbox, round_: int, workdir: pathlib.Path) -> dict:
    """The job applied to the sandbox; node 1's pod SIGKILLed as a whole after the snapshot."""
    name, marks = f"rec-{round_}", workdir / "marks.jsonl"
    body = job_body(name, free_port(), marks)
    body["spec"]["snapshot"]["volume"]["persistentVolumeClaim"]["claimName"] = f"{name}-snapshots"
    metrics = job_snapshot_dir(sandbox.claim(f"{name}-snapshots"), name) / "metrics.jsonl"
    kubectl_apply(sandbox.k8s, body, workdir)
    progress = JobProgress(sandbox.k8s, sandbox.agent, name, metrics)
    try:
        progress.wait(is_event("snapshot", step=KILL_AFTER_STEP), EVENT_TIMEOUT, "the snapshot before the kill")
        (log,) = (sandbox.agent.root / "pods").glob(f"*_{name}-node-0_*/container.log")
        killed_at = time.time()
        sandbox.agent.kill(f"{name}-node-1")
        wait_for(lambda: first_step_after(metrics, killed_at), "the first resumed step")
        return breakdown(killed_at, log, marks, metrics)
    finally:
        sandbox.k8s.kubectl("delete", "ddpjob", name, "--wait=false")
        wait_for(lambda: not sandbox.k8s.list("pods"), "the job's pods gone", timeout=60)


def torchrun_run(workdir: pathlib.Path) -> dict:
    """Two bare torchrun agents with the pods' rendezvous settings; node 1 killed, nobody replaces it."""
    snapshots, marks = workdir / "snapshots", workdir / "marks.jsonl"
    target = ["-m", "ddpjob_trainer.examples.mlp", *ARGS, "--snapshot-dir", str(snapshots)]
    rdzv = Rendezvous("c10d", f"127.0.0.1:{free_port()}", unique_run_id(), "1:4", dict(RDZV_CONF))
    metrics = snapshots / "metrics.jsonl"
    with AgentGroup(workdir, rdzv, target, env={MARKS_ENV: str(marks), "LOGLEVEL": "INFO"}, max_restarts=3) as group:
        group.start("node0")
        victim = group.start("node1", rdzv_conf_extra={"is_host": False})
        MetricsWatcher(metrics, group).wait(is_event("snapshot", step=KILL_AFTER_STEP), EVENT_TIMEOUT,
                                            "the snapshot before the kill")
        killed_at = time.time()
        victim.kill()
        wait_for(lambda: first_step_after(metrics, killed_at), "the first resumed step")
        return breakdown(killed_at, workdir / "node0.log", marks, metrics)


def _events(run_dir: pathlib.Path) -> list[dict]:
    path = run_dir / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _has(metrics: pathlib.Path, kind: str, step: int) -> bool:
    return any(e.get("event") == kind and e.get("step") == step for e in read_events(metrics))


def main() -> None:
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-recovery-") as tmp, Sandbox(pathlib.Path(tmp), ROUNDS) as sandbox:
        for round_ in range(ROUNDS):
            row = {}
            for kind in CONFIGS[round_ % 3:] + CONFIGS[:round_ % 3]:
                workdir = pathlib.Path(tmp) / f"{kind.replace(' ', '-')}-{round_}"
                workdir.mkdir()
                row[kind] = (sandbox_run(sandbox, round_, workdir) if kind == "sandbox" else
                             ddpjob_run(workdir) if kind == "ddpjob run" else torchrun_run(workdir))
                print(f"round {round_ + 1} {kind}: {row[kind]}", flush=True)
            rows.append(row)
    print_table(rows)


def print_table(rows: list[dict]) -> None:
    """Median seconds from the kill to each part, and the first step's ratio to bare torchrun."""
    def median(kind: str, part: str) -> str:
        values = [row[kind][part] for row in rows if row[kind][part] is not None]
        return f"{statistics.median(values):.2f} s" if values else "-"

    print()
    print(f"| kill -> (median of {len(rows)} round(s)) | " + " | ".join(CONFIGS) + " |")
    print("|---" * (len(CONFIGS) + 1) + "|")
    for part in PARTS:
        print(f"| {part} | " + " | ".join(median(kind, part) for kind in CONFIGS) + " |")
    for kind in CONFIGS[:2]:
        ratios = [row[kind]["first step"] / row["torchrun"]["first step"] for row in rows]
        print(f"\n{kind} / bare torchrun, first resumed step: {statistics.median(ratios):.2f}x "
              f"(range {min(ratios):.2f}-{max(ratios):.2f}); world sizes {[row[kind]['world size'] for row in rows]}")


if __name__ == "__main__":
    main()
