"""Goodput and time to recover: the example job with injected node kills, next to a clean run.

Run with ``python -m bench goodput``. One bench run starts the example DDPJob
(manifests/examples/ddpjob-c10d.yaml, its own schedule, the default rendezvous
topology) under ``ddpjob run`` three times, one after the other on the same
machine: without a failure, with one node killed (``--kill-node-after``: SIGKILL of
node 1's whole process tree KILL_AFTER s after the first step), and with two kills
(the second one, by this bench, KILL_AFTER s after the group is back at full size).
Local processes rather than the sandbox: the same launch plan and failure policy,
no pods to schedule, and one process tree to clean up.

Figures, with one definition each, reused rather than restated here:
  * time to recover: kill -> first training step of a trainer start after it
    (bench._recovery.first_step_after, as bench.local_run and bench.sandbox);
    "full size" is the first such step with every node back;
  * lost time and goodput: the operator's own (progress.ingest over the resume
    records the trainer would report: each run from the snapshot it resumed from,
    or the job's start, to its first step; goodput = 1 - lost / wall, metrics.goodput),
    fed from the trainer's metrics file instead of pod termination messages;
  * redone steps: steps in the raw metrics minus steps in the effective history
    (ddpjob_trainer.report.metrics.read_metrics / read_raw_metrics).
Wall time is the local run's own clock: its first events.jsonl record to `phase Succeeded`.

Next to the clean and the 1-kill run, the same job runs as two bare torchrun agents (the local
plan's command, environment and rendezvous settings, torch's c10d backend, fresh Python workers),
clean and with the same kill, node 1 started again by hand after the spec's backoff; the
wall time lost per kill (1-kill wall minus clean wall) is compared between the two. The bare side
keeps that backoff as the reference it has been since 7750f09; `ddpjob run`, as the operator,
replaces a job's first failure incident at once and backs off only in a crash loop
(docs/recovery.md, The restart budget by progress), so its kill is replaced at once too.
Two more runs per round give the spares column: the job with one warm spare
(``spec.elasticPolicy.spareReplicas: 1``, maxReplicas 2 as a spare needs), clean and with the same
kill. Its lost time is against that clean run with the spare: on one machine the waiting spare is a
third process beside two training nodes, and its start (importing torch) slows them whether or not a
node is killed, a cost a cluster does not have (the spare is a pod on a node of its own). The table
prints that cost apart ("the waiting spare's own cost": clean with the spare minus clean without).
``BENCH_GOODPUT_ROUNDS`` (default 1) repeats the six runs behind the ratios (clean and 1-kill
each way: ddpjob run, bare torchrun, ddpjob run with a spare) and prints each round's figures, then
per column the median and range of the wall time lost per kill and the ratios to bare torchrun's:
one run is +-2 s on a shared machine, a quarter of what is compared.

The wait columns (elasticPolicy.replacementWaitSeconds, docs/recovery.md "One pause without
spares"): two more 1-kill runs per round without spares, the kill given as the node's machine lost
(``ddpjob run --node-lost``: free, so the replacement starts at once, as the operator re-creates a
pod whose Node went away), one with no wait (the survivors re-form at reduced size and again when
the replacement joins) and one with a wait of ``BENCH_GOODPUT_WAIT`` s (default 30: the survivors
wait for the replacement, one pause). Per round: wall time lost per kill (against the round's clean
run), the seconds each run fell behind its own pace before the kill (_behind: the figure that
load varying between runs does not move), the pauses, kill -> full size, the steps trained at
reduced size, and the load average (as `uptime` prints it) when each run ended. ``BENCH_GOODPUT_WAIT_ONLY=1`` runs only the clean run and the wait columns.
"""
from __future__ import annotations

import datetime
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import time

import yaml

from bench._recovery import event_time, first_step_after, interrupt_ddpjob_run, wait_for
from ddpjob_operator.api.validation import parse_job
from ddpjob_operator.local.plan import local_plan
from ddpjob_sandbox.metrics import MetricsWatcher, is_event
from ddpjob_sandbox.procs import free_port
from ddpjob_sandbox.torchrun import AgentGroup, Rendezvous, unique_run_id
from ddpjob_sandbox.examples import C10D_EXAMPLE
from ddpjob_sandbox.pod_status import observed_pod, progress_message, terminated_status
from ddpjob_operator.api import constants as C
from ddpjob_operator.controller import metrics as operator_metrics
from ddpjob_operator.decide import progress
from ddpjob_operator.decide.observed import view_pods
from ddpjob_trainer.report.metrics import read_metrics, read_raw_metrics

KILL_AFTER = 5.0  # seconds after the first step (and after full size again, for the second kill)
RUN_TIMEOUT = 400.0  # one run, kills and recoveries included
DDPJOB = Path(sys.executable).parent / "ddpjob"
NODES = 2  # the example's replicas
PAUSE = 1.0  # a gap between two steps longer than this is a pause of training
ROUNDS = int(os.environ.get("BENCH_GOODPUT_ROUNDS", "1"))
WAIT = int(os.environ.get("BENCH_GOODPUT_WAIT", "30"))  # replacementWaitSeconds of the wait column
WAIT_ONLY = os.environ.get("BENCH_GOODPUT_WAIT_ONLY") == "1"


@dataclass(frozen=True)
class RunFigures:
    """What one run measured."""

    kills: int
    wall: float
    steps: int
    redone: int
    recover: list[float | None]  # per kill: kill -> first resumed step (None: the job ended first)
    full_size: list[float | None]  # per kill: kill -> first step with every node back (None: not before the end)
    lost: float
    goodput: float
    pauses: list[float]  # gaps of over PAUSE s between consecutive steps after the first kill
    spares: int = 0  # warm spares the job ran with
    promoted: bool = False  # a spare took a killed node's place (the runner's `promoted` event)
    reduced: int = 0  # steps trained below full size (world size < NODES) after the first kill
    wait: int | None = None  # elasticPolicy.replacementWaitSeconds, when the run set it
    node_lost: bool = False  # the kill stood for the node's machine lost (ddpjob run --node-lost)
    load: float = 0.0  # 1-minute load average when the run ended (uptime's first figure)
    behind: float | None = None  # seconds behind the run's own full-size pace after the first kill (_behind)


SPARES = 1  # warm spares of the spares column


@dataclass(frozen=True)
class Lost:
    """One round: wall seconds lost per node SIGKILL (1-kill wall minus the clean wall), each way."""

    spares: float  # ddpjob run with SPARES warm spares, against the same job's clean run with them
    without: float  # ddpjob run without spares
    bare: float  # bare torchrun agents, replaced by hand after the backoff
    promoted: bool  # the spares run's spare took the killed node's place (else it was not ready yet)
    spare_cost: float  # clean run with the spares minus clean run without: what waiting spares cost
    spares_behind: float | None  # the spares run's kill -> last step minus the work at its pre-kill pace
    without_behind: float | None


@dataclass(frozen=True)
class WaitRound:
    """One round of the wait columns: the clean run and the two node-lost runs, wait 0 and WAIT."""

    clean: RunFigures
    no_wait: RunFigures
    wait: RunFigures


def main() -> None:
    rows, lost, waits = [], [], []
    for round_ in range(ROUNDS):
        runs, bare = {}, {}
        for kills in (0,) if WAIT_ONLY else (0, 1, 2) if round_ == 0 else (0, 1):  # the 2-kill run only once
            runs[kills] = _run(round_, rows, f"run with {kills} kill(s)", kills)
            if kills < 2 and not WAIT_ONLY:
                with tempfile.TemporaryDirectory(prefix="bench-goodput-torchrun-") as tmp:
                    bare[kills] = torchrun_wall(Path(tmp), kills)
                print(f"round {round_ + 1}: bare torchrun with {kills} kill(s): wall {bare[kills]:.1f} s", flush=True)
        if not WAIT_ONLY:
            spared = {kills: _run(round_, rows, f"run with {kills} kill(s) and {SPARES} warm spare(s)", kills,
                                  spares=SPARES) for kills in (0, 1)}
            lost.append(Lost(spared[1].wall - spared[0].wall, runs[1].wall - runs[0].wall, bare[1] - bare[0],
                             spared[1].promoted, spared[0].wall - runs[0].wall, spared[1].behind, runs[1].behind))
        waited = {wait: _run(round_, rows, f"run with 1 node lost, replacementWaitSeconds {wait}", 1, wait=wait,
                             node_lost=True) for wait in (0, WAIT)}
        waits.append(WaitRound(runs[0], waited[0], waited[WAIT]))
    _print_table(rows)
    if lost:
        _print_lost_per_kill(lost)
    _print_wait(waits)


def _run(round_: int, rows: list[RunFigures], what: str, kills: int, **options) -> RunFigures:
    """One measured `ddpjob run` (see measure) in a scratch directory, printed as ``what``; the
    first round's runs also go into the summary table's ``rows``."""
    with tempfile.TemporaryDirectory(prefix="bench-goodput-") as tmp:
        row = measure(Path(tmp), kills, **options)
    if round_ == 0:
        rows.append(row)
    print(f"round {round_ + 1}: {what}: {row}", flush=True)
    return row


def _print_wait(rounds: list[WaitRound]) -> None:
    """The wait columns per round, then the median and range of the wall time lost per kill."""
    print(f"\none node lost (replaced at once), survivors re-forming at once (wait 0) or waiting up to {WAIT} s "
          "for the replacement; wall time lost = 1-kill run minus the round's clean run:")
    print(f"| round | lost, wait 0 | lost, wait {WAIT} s | behind pace, wait 0 | behind pace, wait {WAIT} s "
          f"| pauses, wait 0 | pauses, wait {WAIT} s | kill -> full size, wait 0 / {WAIT} s "
          f"| steps at reduced size, wait 0 / {WAIT} s | load (clean, wait 0, wait {WAIT} s) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for i, r in enumerate(rounds, 1):
        pauses = [", ".join(f"{x:.1f} s" for x in run.pauses) or "-" for run in (r.no_wait, r.wait)]
        full = [", ".join("-" if x is None else f"{x:.1f} s" for x in run.full_size) for run in (r.no_wait, r.wait)]
        print(f"| {i} | {r.no_wait.wall - r.clean.wall:.1f} s | {r.wait.wall - r.clean.wall:.1f} s "
              f"| {r.no_wait.behind} s | {r.wait.behind} s | {pauses[0]} | {pauses[1]} | {full[0]} / {full[1]} "
              f"| {r.no_wait.reduced} / {r.wait.reduced} | {r.clean.load:.1f}, {r.no_wait.load:.1f}, {r.wait.load:.1f} |")
    for name, figure in (("wall time lost per kill", lambda run, clean: run.wall - clean.wall),
                         ("behind the run's own pace", lambda run, clean: run.behind)):
        for label, values in (("wait 0", [figure(r.no_wait, r.clean) for r in rounds]),
                              (f"wait {WAIT} s", [figure(r.wait, r.clean) for r in rounds])):
            values = [v for v in values if v is not None]
            if values:
                print(f"{label}: {name} median {statistics.median(values):.1f} s "
                      f"[{min(values):.1f} .. {max(values):.1f}], {len(values)} round(s)")


def torchrun_wall(workdir: Path, kills: int) -> float:
    """Wall seconds of the same job as two bare torchrun agents (the local plan's argv, env and
    rendezvous settings, node 0 hosting the store); with a kill, node 1's tree is SIGKILLed
    KILL_AFTER s after the first step and a new node-1 agent started after the spec's backoff,
    as a perfect supervisor without an API server would."""
    job = yaml.safe_load(C10D_EXAMPLE.read_text())
    ref, spec = parse_job(job)
    plan = local_plan(ref.name, spec, rdzv_id=unique_run_id(), run_dir=workdir / "run", torchrun="torchrun",
                      port=free_port(), fast_restart=False)
    env = plan.nodes[0].env
    conf = dict(item.split("=", 1) for item in env["PET_RDZV_CONF"].split(",") if not item.startswith("is_host"))
    rdzv = Rendezvous("c10d", env["PET_RDZV_ENDPOINT"], plan.rdzv_id, env["PET_NNODES"], conf)
    extra = {k: v for k, v in env.items() if k.startswith("DDPJOB_")}
    started = time.monotonic()
    with AgentGroup(workdir, rdzv, plan.nodes[0].argv[1:], env=extra, max_restarts=int(env["PET_MAX_RESTARTS"])) as group:
        group.start("node0", rdzv_conf_extra={"is_host": True})
        victim = group.start("node1", rdzv_conf_extra={"is_host": False})
        if kills:
            MetricsWatcher(plan.metrics_file, group).wait(is_event("step"), RUN_TIMEOUT, "the first step")
            time.sleep(KILL_AFTER)
            victim.kill()
            time.sleep(spec.failure_policy.backoff_seconds)
            group.start("node1-replacement", rdzv_conf_extra={"is_host": False})
        codes = group.wait_all(RUN_TIMEOUT)
    if codes.get("node0") != 0:
        raise RuntimeError(f"bare torchrun with {kills} kill(s): node 0 exited {codes}; see {workdir}")
    return time.monotonic() - started


def _print_lost_per_kill(lost: list[Lost]) -> None:
    """Per round and then as median [range]: the wall time lost per kill in each column, and the
    ratios to bare torchrun's (per round, so the range of a ratio is that of side-by-side runs)."""
    print("\nwall time lost per node SIGKILL (1-kill run minus the same job's clean run), side by side per round:")
    print(f"| round | with {SPARES} spare(s) | without spares | bare torchrun | spares / bare | without / bare "
          f"| spare promoted | the waiting spare's own cost | behind pace, with / without spares |")
    print("|---|---|---|---|---|---|---|---|---|")
    for i, row in enumerate(lost, 1):
        print(f"| {i} | {row.spares:.1f} s | {row.without:.1f} s | {row.bare:.1f} s | {row.spares / row.bare:.2f}x "
              f"| {row.without / row.bare:.2f}x | {'yes' if row.promoted else 'no'} | {row.spare_cost:.1f} s "
              f"| {row.spares_behind} s / {row.without_behind} s |")
    columns = {"with spares": [r.spares for r in lost], "without spares": [r.without for r in lost],
               "bare torchrun": [r.bare for r in lost]}
    for name, values in columns.items():
        print(f"{name}: median {statistics.median(values):.1f} s [{min(values):.1f} .. {max(values):.1f}]")
    for name, target, values in (("with spares", 0.2, [r.spares / r.bare for r in lost]),
                                 ("without spares", 0.3, [r.without / r.bare for r in lost])):
        print(f"{name} / bare torchrun: median {statistics.median(values):.2f}x [{min(values):.2f} .. "
              f"{max(values):.2f}] (target <= {target}x), {len(lost)} round(s)")


def measure(workdir: Path, kills: int, spares: int = 0, wait: int | None = None, node_lost: bool = False) -> RunFigures:
    """One `ddpjob run` of the example with `kills` injected node kills (0, 1 or 2) and `spares`
    warm spares (the example then as a fixed-size job: maxReplicas = replicas, as spares need);
    `wait`: its replacementWaitSeconds (None: the spec's default); `node_lost`: the runner's kill
    stands for the node's machine lost (free, replaced at once)."""
    run_dir, job = workdir / "run", workdir / "job.yaml"
    body = yaml.safe_load(C10D_EXAMPLE.read_text())
    if spares:
        body["spec"]["elasticPolicy"].update({"maxReplicas": body["spec"]["replicas"], "spareReplicas": spares})
    if wait is not None:
        body["spec"]["elasticPolicy"]["replacementWaitSeconds"] = wait
    job.write_text(yaml.safe_dump(body, sort_keys=False))
    argv = [str(DDPJOB), "run", str(job), "--workdir", str(run_dir), "--port", "0", "--plain"]
    if kills:
        argv += ["--kill-node-after", str(KILL_AFTER)] + (["--node-lost"] if node_lost else [])
    with open(workdir / "ddpjob.out", "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        kill_times = _inject(run_dir, kills)
        code = proc.wait(timeout=RUN_TIMEOUT)
    finally:
        _stop(proc, run_dir)
    if code != 0:
        raise RuntimeError(f"ddpjob run with {kills} kill(s) exited {code}; see {workdir / 'ddpjob.out'}")
    return replace(_figures(run_dir, kill_times), spares=spares, promoted=bool(_event(run_dir, "promoted")),
                   wait=wait, node_lost=node_lost, load=round(os.getloadavg()[0], 1))


def _inject(run_dir: Path, kills: int) -> list[float]:
    """Waits for the runner's own kill, then kills the same node once more by hand when asked."""
    if not kills:
        return []
    first = event_time(wait_for(lambda: _event(run_dir, "killed"), "the injected kill", RUN_TIMEOUT))
    if kills == 1:
        return [first]
    metrics = run_dir / "snapshots" / "metrics.jsonl"
    back = wait_for(lambda: first_step_after(metrics, first, NODES), "the group back at full size", RUN_TIMEOUT)
    wait_for(lambda: _now() >= event_time(back) + KILL_AFTER, "the second kill's moment")
    node = _event(run_dir, "started", node=NODES - 1, last=True)
    second = _now()
    try:
        os.killpg(node["pid"], signal.SIGKILL)  # the node's whole tree, as the runner's own kill
    except ProcessLookupError:
        # On a calm machine the job can finish before the second kill's moment; the row then
        # says kills=1 rather than a kill that never happened.
        print(f"the second kill came after node {NODES - 1} had exited (the job finished): this run counts one kill")
        return [first]
    return [first, second]


def _figures(run_dir: Path, kill_times: list[float]) -> RunFigures:
    metrics = run_dir / "snapshots" / "metrics.jsonl"
    events = _events(run_dir)
    start = events[0]["time"]
    end = next(e["time"] for e in events if e["event"] == "phase" and e["phase"] == "Succeeded")
    raw, effective = read_raw_metrics(metrics), read_metrics(metrics)
    steps = sum(1 for e in effective if e["event"] == "step")
    recover = [_seconds_after(first_step_after(metrics, t), t) for t in kill_times]
    full = [_seconds_after(first_step_after(metrics, t, NODES), t) for t in kill_times]
    status = {"startTime": start, "completionTime": end}
    pods = view_pods(_reports(raw))
    for moment in kill_times:  # as the operator: one incident at a time, the resumes seen after it
        status["lastFailureTime"] = _text(moment)
        status.update(progress.ingest(pods, status).changes)
    status.update(progress.ingest(pods, status).changes)
    completed = datetime.datetime.fromisoformat(end.replace("Z", "+00:00"))
    return RunFigures(kills=len(kill_times), wall=round(event_time({"time": end}) - event_time({"time": start}), 1),
                      steps=steps, redone=sum(1 for e in raw if e["event"] == "step") - steps,
                      recover=[None if x is None else round(x, 1) for x in recover],
                      full_size=[None if x is None else round(x, 1) for x in full],
                      lost=_lost(status["recovery"]),
                      goodput=round(operator_metrics.goodput(status, completed), 3),
                      pauses=_pauses(raw, kill_times[0]) if kill_times else [],
                      reduced=_reduced(raw, kill_times[0]) if kill_times else 0,
                      behind=_behind(effective, kill_times[0]) if kill_times else None)


def _seconds_after(event: dict | None, moment: float) -> float | None:
    """Seconds from ``moment`` to ``event``; None when it never came (the job ended first)."""
    return None if event is None else event_time(event) - moment


def _lost(recovery: dict) -> float:
    """The operator's lost time (``lostSeconds``, restarts only: the first run's start-up is
    ``startupSeconds`` and not lost), absent in a run that never restarted."""
    return float(recovery.get("lostSeconds") or 0)


def _pauses(raw: list[dict], since: float) -> list[float]:
    """How long training stood still each time after `since`: one gap per incident when the
    replacement joins in the survivors' round, two when the survivors restart again for it."""
    times = [event_time(e) for e in raw if e["event"] == "step" and event_time(e) > since]
    return [round(b - a, 1) for a, b in zip([since, *times], times) if b - a > PAUSE]


def _reduced(raw: list[dict], since: float) -> int:
    """Steps trained after `since` by a group below full size (world size under NODES): what the
    survivors train between re-forming without the lost node and the replacement's joining."""
    return sum(1 for e in raw if e["event"] == "step" and event_time(e) > since and e.get("world_size", NODES) < NODES)


def _behind(effective: list[dict], since: float) -> float | None:
    """Seconds the run fell behind its own pace by the kill at `since`: from the kill to the last
    step, minus the time the work trained after it takes at the pace of the full-size steps before
    it (a step of a group of w nodes is w / NODES of a full-size step: it trains w batches). Unlike
    the wall time against the clean run, load that differs between two runs does not enter it
    (measured here at load 3-6: clean runs of 31.5 s, 62.5 s and 34.3 s); load that changes within
    the run does. None without two full-size steps before the kill."""
    steps = [e for e in effective if e["event"] == "step"]
    before = [event_time(e) for e in steps if event_time(e) <= since and e.get("world_size") == NODES]
    after = [e for e in steps if event_time(e) > since]
    if len(before) < 2 or not after:
        return None
    pace = (before[-1] - before[0]) / (len(before) - 1)  # seconds per full-size step
    work = sum(e.get("world_size", NODES) / NODES for e in after)
    return round(event_time(after[-1]) - since - work * pace, 1)


def _reports(raw: list[dict]) -> list[dict]:
    """Each trainer start as the progress record its node would report in a pod's termination
    message (ddpjob_trainer/report/record.py), wrapped as a pod so progress.ingest reads it."""
    pods = []
    for i, start in enumerate(e for e in raw if e["event"] == "start"):
        later = [e for e in raw if event_time(e) >= event_time(start)]
        first_step = next((e for e in later if e["event"] == "step"), None)
        step = start.get("resume_step") or None
        # The volume snapshot of that step, else the fast tier's copy, which the trainer makes right
        # after the step (it logs no event of its own): the step's time stands for the copy's. The
        # trainer reports the loaded copy's own time; without this a fast-tier resume had no
        # snapshot time and its lost time counted from the job's start.
        snapshot = next((e for e in reversed(raw) if e["event"] in ("snapshot", "step") and e["step"] == step
                         and event_time(e) <= event_time(start)), None) if step else None
        record = progress_message(None, node="0", resume={
            "time": start["time"], "fromStep": step, "fromSnapshotTime": snapshot["time"] if snapshot else None,
            "firstStepTime": first_step["time"] if first_step else None})
        finished = (first_step or start)["time"]
        pods.append(observed_pod(f"run-{i}", terminated_status(C.CONTAINER_NAME, start["time"], finished, 0, record)))
    return pods


def _events(run_dir: Path) -> list[dict]:
    path = run_dir / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _event(run_dir: Path, kind: str, last: bool = False, **match) -> dict | None:
    found = [e for e in _events(run_dir) if e["event"] == kind and all(e.get(k) == v for k, v in match.items())]
    return (found[-1] if last else found[0]) if found else None


def _now() -> float:
    return datetime.datetime.now(datetime.timezone.utc).timestamp()


def _text(moment: float) -> str:
    return datetime.datetime.fromtimestamp(moment, datetime.timezone.utc).isoformat(
        timespec="milliseconds").replace("+00:00", "Z")


def _stop(proc: subprocess.Popen, run_dir: Path) -> None:
    if proc.poll() is None:
        interrupt_ddpjob_run(proc, run_dir, 30)  # as Ctrl-C: ddpjob stops every node


def _print_table(rows: list[RunFigures]) -> None:
    clean = rows[0]
    print()
    print("| run | wall | steps (redone) | kill -> first resumed step | kill -> full size | lost | goodput "
          "| wall / clean | goodput / clean |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        name = ("clean" if not row.kills else f"{row.kills} node {'loss' if row.node_lost else 'kill(s)'}") + (
            f", {row.spares} spare(s)" if row.spares else "") + (f", wait {row.wait} s" if row.wait is not None else "")
        recover = ", ".join("not before the end" if x is None else f"{x:.1f} s" for x in row.recover) or "-"
        full = ", ".join("not before the end" if x is None else f"{x:.1f} s" for x in row.full_size) or "-"
        print(f"| {name} | {row.wall:.1f} s | {row.steps} ({row.redone}) | {recover} | {full} | {row.lost:.1f} s "
              f"| {row.goodput:.3f} | {row.wall / clean.wall:.2f}x | {row.goodput / clean.goodput:.2f}x |")


if __name__ == "__main__":
    main()
