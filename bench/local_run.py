"""`ddpjob run` benchmark: recovery from a dead node, next to bare torchrun.

Run with ``python -m bench local_run``. The same job (the example DDPJob with a
longer, slowed-down schedule so the kill lands mid-training), the same
rendezvous settings (the local run's PET_RDZV_CONF, node 0 hosting the c10d
store) and the same fault: the whole process tree of node 1, a node that does
not host the store, is SIGKILLed a fixed time after the first training step.

Measured: seconds from the kill to the first training step after it (the
survivor's resumed step), once under ``ddpjob run`` (its CLI, as a user runs
it) and once as two bare torchrun agents (``ddpjob_sandbox.torchrun.AgentGroup``),
alternating in ROUNDS rounds. The ratio is taken within each round (neighbouring
runs share the machine's load) and its median reported with the range.
Each round also prints the world size of that first step: 1 when the survivor
went on alone. Before `ddpjob run` held replacements until the survivors resumed
(runner/policy.hold_replacements) it was 2 in 3 of 4 rounds on a loaded machine:
the replacement, due after the 10 s backoff, joined while the survivor was still
re-forming the group, which cost one more restart (1.87x bare torchrun).
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from ddpjob_operator.local.plan import local_plan
from ddpjob_operator.api.validation import parse_job
from ddpjob_sandbox.examples import load_example, write_manifest
from ddpjob_sandbox.procs import free_port
from bench._recovery import EVENT_TIMEOUT, event_time, first_step_after, interrupt_ddpjob_run, wait_for
from ddpjob_sandbox.torchrun import AgentGroup, Rendezvous, unique_run_id
from ddpjob_sandbox.metrics import MetricsWatcher, is_event

ROUNDS = 4
TARGET = 1.2  # ddpjob run may take at most this many times bare torchrun's recovery
KILL_AFTER = 3.0  # seconds after the first training step
# Long enough that training is still running well after the kill and the resume.
BENCH_ARGS = ["--epochs", "50", "--samples", "512", "--batch-size", "32", "--snapshot-every-epochs", "1",
              "--step-sleep", "0.05", "--val-samples", "0", "--no-progress-bar"]
DDPJOB = Path(sys.executable).parent / "ddpjob"


def bench_job(workdir: Path) -> Path:
    """The example job with the bench's schedule, written to workdir/job.yaml."""
    job = load_example()
    job["spec"]["args"] = BENCH_ARGS
    job["spec"]["elasticPolicy"]["rdzvStore"] = "node"  # as the bare torchrun side: node 0 hosts the store
    return write_manifest(job, workdir / "job.yaml")


def ddpjob_recovery(workdir: Path) -> tuple[float, int]:
    """`ddpjob run --kill-node-after`: kill -> first resumed step (seconds, its world size)."""
    run_dir = workdir / "run"
    with open(workdir / "ddpjob.out", "wb") as out:
        proc = subprocess.Popen([str(DDPJOB), "run", str(bench_job(workdir)), "--workdir", str(run_dir),
                                 "--port", "0", "--plain", "--kill-node-after", str(KILL_AFTER)],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        def killed():
            path = run_dir / "events.jsonl"
            events = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
            return next((e for e in events if e["event"] == "killed"), None)

        killed_at = event_time(wait_for(killed, "the injected kill"))
        first = wait_for(lambda: first_step_after(run_dir / "snapshots" / "metrics.jsonl", killed_at),
                         "the first resumed step")
        return event_time(first) - killed_at, first["world_size"]
    finally:
        interrupt_ddpjob_run(proc, run_dir, timeout=30)  # as Ctrl-C: ddpjob stops every node


def torchrun_recovery(workdir: Path) -> tuple[float, int]:
    """Two bare torchrun agents from the same launch plan; kill -> first resumed step (seconds, world size)."""
    job = yaml.safe_load(bench_job(workdir).read_text())
    ref, spec = parse_job(job)
    plan = local_plan(ref.name, spec, rdzv_id=unique_run_id(), run_dir=workdir / "run", torchrun="torchrun",
                      port=free_port())
    env = plan.nodes[0].env
    conf = dict(item.split("=", 1) for item in env["PET_RDZV_CONF"].split(",") if not item.startswith("is_host"))
    rdzv = Rendezvous("c10d", env["PET_RDZV_ENDPOINT"], plan.rdzv_id, env["PET_NNODES"], conf)
    extra = {k: v for k, v in env.items() if k.startswith("DDPJOB_")}
    metrics = plan.metrics_file
    with AgentGroup(workdir, rdzv, plan.nodes[0].argv[1:], env=extra,
                    max_restarts=int(env["PET_MAX_RESTARTS"])) as group:
        group.start("node0", rdzv_conf_extra={"is_host": True})
        victim = group.start("node1", rdzv_conf_extra={"is_host": False})
        MetricsWatcher(metrics, group).wait(is_event("step"), EVENT_TIMEOUT, "the first step")
        time.sleep(KILL_AFTER)
        killed_at = time.time()
        victim.kill()
        first = wait_for(lambda: first_step_after(metrics, killed_at), "the first resumed step")
    return event_time(first) - killed_at, first["world_size"]


def main() -> None:
    rows = []
    for round_ in range(ROUNDS):
        order = [("ddpjob run", ddpjob_recovery), ("torchrun", torchrun_recovery)]
        if round_ % 2:
            order.reverse()
        seconds, worlds = {}, {}
        for name, measure in order:
            with tempfile.TemporaryDirectory(prefix="bench-local-run-") as tmp:
                seconds[name], worlds[name] = measure(Path(tmp))
        rows.append(seconds)
        print(f"round {round_ + 1}: ddpjob run {seconds['ddpjob run']:.2f} s (world size {worlds['ddpjob run']}), "
              f"torchrun {seconds['torchrun']:.2f} s (world size {worlds['torchrun']})", flush=True)
    ratios = [row["ddpjob run"] / row["torchrun"] for row in rows]
    print()
    print("| kill -> first resumed step | ddpjob run | bare torchrun | ratio (target <= %.1fx) |" % TARGET)
    print("|---|---|---|---|")
    print(f"| median of {ROUNDS} rounds | {statistics.median(r['ddpjob run'] for r in rows):.2f} s "
          f"| {statistics.median(r['torchrun'] for r in rows):.2f} s "
          f"| {statistics.median(ratios):.2f}x (range {min(ratios):.2f}-{max(ratios):.2f}) |")


if __name__ == "__main__":
    main()
