"""`ddpjob run JOB.yaml`: check everything that can be checked before a process starts, then run.

Each problem found here (no torchrun, a busy rendezvous port, an env entry with
valueFrom, a --kill-node outside the job) is a LocalRunError with one message
saying what to change; cli.py prints it and exits non-zero.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import secrets
import signal
import sys
import threading
from datetime import datetime
from pathlib import Path
from typing import TextIO

from ddpjob_operator.render.launch import UnsupportedLocalEnvError
from ddpjob_operator.api.spec import DDPJobSpec
from .plan import LOOPBACK, LocalPlan, local_plan, local_runtime_dir, rdzv_endpoint
from .procs import free_port, port_in_use
from .runner import PHASE_INTERRUPTED, STOP_SIGNALS, RunOptions, RunResult, Runner

EXIT_JOB_FAILED = 3  # the job ran and failed (permanent exit code, restart budget spent)
EXIT_INTERRUPTED = 130  # Ctrl-C / SIGTERM, as a shell reports SIGINT


class LocalRunError(Exception):
    """The job cannot run on this machine as given; the message says what to change."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `ddpjob run`."""
    parser.add_argument("job", help="DDPJob YAML file, or - for stdin")
    parser.add_argument("--workdir", type=Path, help="run directory (default: runs/<job>-<time>); "
                        "an existing one resumes from its snapshots")
    parser.add_argument("--port", type=int, help="c10d rendezvous port instead of spec.elasticPolicy.rdzvPort "
                        "(0 = any free port)")
    parser.add_argument("--kill-node-after", type=float, metavar="SECONDS",
                        help="inject a failure: SIGKILL one node's whole process tree this many seconds "
                        "after the first training step")
    parser.add_argument("--kill-node", type=int, metavar="INDEX",
                        help="the node --kill-node-after kills (default: the last one that trains: not node 0, not a spare)")
    parser.add_argument("--node-lost", action="store_true",
                        help="the --kill-node-after kill stands for the node's machine lost, as the operator "
                        "judges a pod whose Node went away: free and replaced at once (default: a crash of "
                        "the node, charged unless a newer snapshot was complete, replaced after the backoff)")
    parser.add_argument("--spec-rdzv-timeouts", action="store_true",
                        help="keep the spec's rendezvous timeouts (by default a local run shortens "
                        "lastCallSeconds and the keep-alive, see the printed note)")
    parser.add_argument("--plain", action="store_true", help="plain log lines even on a terminal")


def torchrun_path() -> Path:
    """The torchrun next to this Python, so nodes use the same environment as `ddpjob`."""
    path = Path(sys.executable).parent / "torchrun"
    if not path.exists():
        raise LocalRunError(f"torchrun not found next to {sys.executable} ({path}): install torch into "
                            "this environment (pip install ddpjob-trainer) and run ddpjob from it")
    return path


def check_code(spec: DDPJobSpec) -> None:
    """The module's top-level package or the script exists here (cheap: imports nothing)."""
    if spec.script and not Path(spec.script).exists():
        raise LocalRunError(f"spec.script ({spec.script}) does not exist on this machine: "
                            "give a path relative to this directory or an absolute local path")
    if spec.module and importlib.util.find_spec(spec.module.split(".")[0]) is None:
        raise LocalRunError(f"spec.module ({spec.module}) cannot be imported here: package "
                            f"{spec.module.split('.')[0]!r} is not installed in {sys.prefix}")


PROGRESS_API = "ddpjob_trainer"  # code that imports it can report steps (Trainer, Job)


def reports_progress(spec: DDPJobSpec) -> bool:
    """Whether the job's code can report training steps: its file mentions ddpjob_trainer.

    A plain-torch script reports nothing, so `--kill-node-after` counts from the start for
    it instead of waiting for a first step that never comes (cheap: reads one file).
    """
    source = _code_file(spec)
    try:
        return source is not None and PROGRESS_API in source.read_text(errors="replace")
    except OSError:
        return False


def _code_file(spec: DDPJobSpec) -> Path | None:
    """spec.script, or spec.module's file found without importing anything."""
    if spec.script:
        return Path(spec.script)
    parts = spec.module.split(".")
    top = importlib.util.find_spec(parts[0])
    if top is None:
        return None
    if not top.submodule_search_locations:  # a single-file module
        return Path(top.origin) if top.origin else None
    path = Path(list(top.submodule_search_locations)[0], *parts[1:])
    return path.with_suffix(".py") if path.with_suffix(".py").is_file() else path / "__main__.py"


def check_cluster_only(spec: DDPJobSpec) -> None:
    """Fields that need a cluster (a Secret, an operator-run etcd) or mean "do not run"."""
    ep = spec.elastic_policy
    if ep.rdzv_secret_name is not None:
        raise LocalRunError(f"spec.elasticPolicy.rdzvSecretName ({ep.rdzv_secret_name}) names a Secret, which only a "
                            "cluster can mount: remove it for a local run and use an etcd that needs no credentials")
    if ep.managed_etcd.enabled:
        raise LocalRunError("spec.elasticPolicy.managedEtcd.enabled (true) asks the operator to run etcd, which a "
                            "local run does not: start etcd yourself, list it in rdzvEndpoints and disable managedEtcd")
    if spec.run_policy.suspend:
        raise LocalRunError("spec.runPolicy.suspend (true) means no node runs: set it to false to run the job")


def choose_port(spec: DDPJobSpec, port: int | None) -> int | None:
    """The c10d port to use; refuses a busy one (node 0's store could not listen on it)."""
    if spec.elastic_policy.rdzv_backend != "c10d":
        return None
    if port == 0:
        return free_port(LOOPBACK)
    chosen = port if port is not None else spec.elastic_policy.rdzv_port
    if port_in_use(LOOPBACK, chosen):
        source = "--port" if port is not None else "spec.elasticPolicy.rdzvPort"
        raise LocalRunError(f"{source} ({chosen}) is already in use on {LOOPBACK}: stop what listens there, "
                            "or pass --port N (--port 0 picks a free one)")
    return chosen


def prepare(job: str, spec: DDPJobSpec, args: argparse.Namespace) -> tuple[LocalPlan, Path]:
    """The plan and the run directory, after every check that needs no process."""
    if args.kill_node is not None and not 0 <= args.kill_node < spec.desired_replicas:
        raise LocalRunError(f"--kill-node ({args.kill_node}) must be a node index 0..{spec.desired_replicas - 1} "
                            f"(spec.replicas is {spec.desired_replicas})")
    if args.kill_node_after is not None and args.kill_node_after < 0:
        raise LocalRunError(f"--kill-node-after ({args.kill_node_after:g}) must be >= 0 seconds")
    if args.node_lost and args.kill_node_after is None:
        raise LocalRunError("--node-lost says what the --kill-node-after kill stands for: give --kill-node-after too")
    check_cluster_only(spec)
    torchrun = torchrun_path()
    check_code(spec)
    port = choose_port(spec, args.port)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = args.workdir or Path("runs") / f"{job}-{stamp}"
    rdzv_id = f"{job}-{stamp}-{secrets.token_hex(3)}"  # a finished rendezvous id cannot be reused
    try:
        plan = local_plan(job, spec, rdzv_id=rdzv_id, run_dir=run_dir.resolve(), torchrun=str(torchrun),
                          port=port, fast_rendezvous=not args.spec_rdzv_timeouts,
                          runtime_dir=local_runtime_dir(os.environ))
    except UnsupportedLocalEnvError as e:
        raise LocalRunError(str(e)) from None
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise LocalRunError(f"cannot create the run directory {run_dir}: {e.strerror}; pass --workdir DIR") from None
    return plan, run_dir.resolve()


def header(plan: LocalPlan, run_dir: Path, args: argparse.Namespace) -> list[str]:
    """What the run is about to do, including everything it changed from the spec."""
    ep, fp = plan.spec.elastic_policy, plan.spec.failure_policy
    spares = f" + {len(plan.spares)} warm spare(s)" if plan.spares else ""
    lines = [f"ddpjob run: job {plan.job}, {plan.replicas} local node(s){spares} (elastic {plan.spec.min_replicas}.."
             f"{plan.spec.max_replicas}), {ep.rdzv_backend} rendezvous at {rdzv_endpoint(plan)}, "
             f"rdzv id {plan.rdzv_id}",
             f"run directory {run_dir}: snapshots/, logs/node-<i>.log, events.jsonl, launch.json, "
             "at the end timeline.json and timeline.svg",
             f"failure policy: maxRestarts {fp.max_restarts}, a crash loop backs off {fp.backoff_seconds} s "
             f"doubling to {fp.max_backoff_seconds} s (a first crash is replaced at once), "
             f"permanent exit codes {fp.permanent_exit_codes}"]
    lines += [f"note: {note}" for note in plan.notes]
    if args.kill_node_after is not None:
        victim = args.kill_node if args.kill_node is not None else plan.replicas - 1
        when = ("the first training step" if reports_progress(plan.spec) else
                "the start (the code does not use ddpjob_trainer, so no training step is reported)")
        lost = " as its machine lost (free, replaced at once)" if args.node_lost else ""
        lines.append(f"will SIGKILL node {victim} {args.kill_node_after:g} s after {when}{lost}")
    if plan.nodes and plan.nodes[0].cwd is not None:
        lines.append(f"working directory {plan.nodes[0].cwd}: relative paths the script saves land here "
                     "(a new run gets a new one)")
    return lines


def execute(job: str, spec: DDPJobSpec, args: argparse.Namespace, out: TextIO) -> int:
    """Runs the job; returns the exit code (0 succeeded, EXIT_JOB_FAILED, EXIT_INTERRUPTED).

    Raises:
        LocalRunError: before any process started.
    """
    plan, run_dir = prepare(job, spec, args)
    for line in header(plan, run_dir, args):
        print(line, file=out, flush=True)
    live = out.isatty() and not args.plain
    options = RunOptions(kill_after=args.kill_node_after, kill_node=args.kill_node, live=live,
                         kill_from_start=not reports_progress(plan.spec), node_lost=args.node_lost)
    with _stop_signals_as_interrupt():
        result = Runner(plan, run_dir, options, out).run()
    return report(result, out)


def report(result: RunResult, out: TextIO) -> int:
    for line in result.summary.lines + result.timeline:
        print(line, file=out)
    print(f"{result.phase}: {result.message}", file=out, flush=True)
    if result.phase == "Succeeded":
        return 0
    return EXIT_INTERRUPTED if result.phase == PHASE_INTERRUPTED else EXIT_JOB_FAILED


class _stop_signals_as_interrupt:
    """SIGINT and SIGTERM stop the run like Ctrl-C (every node stopped), then the old handlers return.

    SIGINT too, not only SIGTERM: Python raises KeyboardInterrupt on SIGINT only when SIGINT was
    not ignored at its start, and a shell starts a script's background job (`ddpjob run ... &`,
    or anything that job starts) with SIGINT ignored: such a run trained on through the Ctrl-C a
    script or a bench sent it. torchrun handles SIGINT itself for the same reason.
    """

    def __enter__(self):
        self.previous = {}
        if threading.current_thread() is threading.main_thread():
            self.previous = {sig: signal.signal(sig, self._raise) for sig in STOP_SIGNALS}
        return self

    @staticmethod
    def _raise(signum, frame):
        raise KeyboardInterrupt

    def __exit__(self, *exc):
        for sig, previous in self.previous.items():
            if previous is not None:  # None: a handler not set from Python, which cannot be put back
                signal.signal(sig, previous)
