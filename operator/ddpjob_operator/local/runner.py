"""The local run loop: start the nodes, watch them and the metrics, apply the failure policy.

One pass every POLL_SECONDS: read new metrics lines, inject the requested kill,
reap exited nodes and act on the failure policy's decision (replace after the
backoff, or fail the run), start replacements that are due, and stop nodes left
running after training finished. Everything the runner does is appended to
`events.jsonl` in the run directory (one JSON object per line with `time`, the
run clock `t` in seconds, `event`, and `node` where one is concerned):

    started  {node, pid, start, spare}          an agent was started (start > 1: a replacement; spare: to wait outside the group)
    promoted {node, replaces, message}          a warm spare took a lost node's place (the lost node's replacement is the new spare)
    killed   {node, pid, why}                   the injected failure (SIGKILL of the node's tree)
    exited   {node, code, action, message, incidents, replace_at}
    stopped  {node, why}                        stopped by the runner
    held     {nodes, message}                   due replacements wait for the survivors' first step
    group_restart {generation, message}         the rendezvous store was lost: every node restarts
    store_started / store_exited {pid | code, message}   the rendezvous store process (rdzvStore: pod)
    phase    {phase, message}                   Running, Restarting, Succeeded, Failed, Interrupted

Losing the rendezvous store (node 0 with the store on the node, or the store
process with rdzvStore: pod) restarts the whole group under the next
rendezvous generation, as the operator does (topology.py): the other nodes
are stopped, one incident is counted, and every node starts again after the
backoff with PET_RDZV_ID `<id>-<generation>`.

Warm spares (spec.elasticPolicy.spareReplicas): nodes replicas.. start with the others,
but their agents join the rendezvous only once the group trains (DDPJOB_SPARE,
ddpjob_trainer/rendezvous/early.py), so they wait in torch's redundancy list, warm (torch
imported, fork server up), outside the group. When a training node is lost, a running spare
joins the survivors' next round by itself (the rendezvous moves it to the wait list as the
round loses a participant): the runner records it as promoted, and the lost node's
replacement becomes the new spare (DDPJOB_SPARE follows the role, not the index).

A kill given as `--node-lost` stands for the node's machine going away: judged as the operator
judges a pod whose Node was lost (policy.LOST_REASON, decide/failure.py opens_incident), it is
free and its replacement starts at once. With elasticPolicy.replacementWaitSeconds the
survivors hold their round open for that replacement (ddpjob_trainer/rendezvous/early.py), so
it is never held back here for their first step (policy.hold_replacements).

Run directory: `snapshots/` (spec.snapshot.mountPath of the Pods), `logs/node-<i>.log`
(every incarnation of node i, appended), `launch.json` (each node's argv and the
launch plan's environment), `events.jsonl`, and at the end `timeline.json` with its picture
`timeline.svg` (timeline.py; the picture needs the [plot] extra).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

from ddpjob_rdzv.contract import SPARE_ENV

from ddpjob_operator.api import constants as C
from ddpjob_operator.render.launch import rdzv_id
from .journal import Journal, MetricsFollower, write_timeline
from .plan import LocalNode, LocalPlan, inherited_env
from .policy import Action, Decision, FailureBudget, hold_replacements
from .procs import NodeProcess, kill_marked_until_gone, remove_fast_tier_dirs, remove_fork_server_dirs, stop_all
from .state import RUNNING, SPARE, RunState, apply_metric, apply_node_event
from .summary import Summary, summarize
from .view import LiveView, PlainView

POLL_SECONDS = 0.2  # how often nodes and metrics are checked
REFRESH_SECONDS = 0.5  # how often the live table is redrawn
# Code that reports no steps: torchrun's worker restarts are read from the workers' environment
# (a /proc scan, a few ms) this often instead.
WORKER_SCAN_SECONDS = 2.0
# After a node finished, others still running this long are stopped, as the operator does
# (a node left waiting in torchrun's exit barrier, or a replacement in a rendezvous that already
# closed, would otherwise hold the run for minutes). Healthy nodes exit well within it.
FINISH_GRACE_SECONDS = C.FINISH_GRACE_SECONDS

PHASE_INTERRUPTED = "Interrupted"  # local only: Ctrl-C or SIGTERM stopped the run
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # Ctrl-C, and what kill, timeout or systemd send


@dataclass(frozen=True)
class RunOptions:
    """How to run: the injected failure and the view."""

    kill_after: float | None = None  # SIGKILL a node this many seconds after the first training step
    kill_node: int | None = None  # which node (default: the highest index, so not node 0)
    kill_from_start: bool = False  # count kill_after from the run's start: the code reports no steps
    node_lost: bool = False  # the kill stands for the node's machine lost: free, replaced at once (policy.LOST_REASON)
    live: bool = False  # live table (a TTY) instead of plain lines
    finish_grace: float = FINISH_GRACE_SECONDS


@dataclass(frozen=True)
class RunResult:
    """How the run ended."""

    phase: str  # Succeeded, Failed or Interrupted
    message: str
    summary: Summary
    timeline: list[str]  # where the timeline picture and its data are (or how to get the picture)


class Runner:
    """Runs a LocalPlan to its end; `run()` returns the RunResult."""

    def __init__(self, plan: LocalPlan, run_dir: Path, options: RunOptions, out: TextIO):
        self.plan, self.run_dir, self.options = plan, run_dir, options
        self.t0 = time.monotonic()
        self.view = LiveView(out) if options.live else PlainView(out)
        self.state = RunState.new(plan.job, plan.replicas, plan.spec.failure_policy.max_restarts, len(plan.spares))
        self.budget = FailureBudget(plan.spec.failure_policy)
        self.metrics = MetricsFollower(plan.metrics_file)
        self.journal = Journal(run_dir / "events.jsonl", self.clock)
        self.base_env = inherited_env(dict(os.environ))
        self.procs: dict[int, NodeProcess] = {}  # running incarnations by node index
        self.due: dict[int, float] = {}  # node index -> run-clock second its replacement starts
        self.store: NodeProcess | None = None  # the rendezvous store process (rdzvStore: pod)
        self.generation = 0  # whole-group restarts so far (status.rendezvousGeneration)
        self.spares: set[int] = set(plan.spares)  # node indices in the spare role now (swapped at a promotion)
        self.first_step: float | None = None
        self.snapshot: dict | None = None  # newest complete snapshot in the metrics {step, epoch, time}
        self.last_step: float | None = None  # run clock of the latest step event read
        self.failed_at: float | None = None  # run clock of the latest node failure (a replacement came due)
        self.worker_restarts: dict[tuple[int, int], int] = {}  # (node, start) -> torchrun restarts seen
        self.scanned = -WORKER_SCAN_SECONDS
        self.holding = False
        self.killed = False
        self.killed_proc: NodeProcess | None = None  # the incarnation the injected kill hit
        self.finished_at: float | None = None
        self.failure: str | None = None

    def clock(self) -> float:
        """Seconds since the run started."""
        return time.monotonic() - self.t0

    def run(self) -> RunResult:
        self._write_launch()
        phase, message = PHASE_INTERRUPTED, "interrupted (Ctrl-C or SIGTERM): every node was stopped"
        try:
            self._start_store()
            for node in self.plan.nodes:
                self._start(node.index)
            phase, message = self._loop()
        except KeyboardInterrupt:
            pass
        finally:
            self._stop_everything()
        self._read_metrics()
        self._event("phase", phase=phase, message=message)
        self.view.close(self.state, self.clock())
        self.journal.close()
        return RunResult(phase, message, summarize(self.plan.metrics_file), self._timeline())

    # -- the loop ---------------------------------------------------------------

    def _loop(self) -> tuple[str, str]:
        last_refresh = -REFRESH_SECONDS
        while True:
            self._read_metrics()
            self._scan_workers()
            self._maybe_kill()
            self._reap_store()
            self._reap()
            deadline = self.plan.spec.run_policy.active_deadline_seconds
            if deadline and self.clock() >= deadline and self.finished_at is None:
                self.failure = C.MSG_DEADLINE.format(deadline=deadline)
            if self.failure:
                return "Failed", self.failure
            self._start_due()
            self._stop_stragglers()
            if not self.procs and not self.due:
                return "Succeeded", f"training finished; {self.budget.restarts} failure incident(s) recovered from"
            if self.clock() - last_refresh >= REFRESH_SECONDS:
                last_refresh = self.clock()
                self.view.refresh(self.state, last_refresh)
            time.sleep(POLL_SECONDS)

    def _read_metrics(self) -> None:
        for event in self.metrics.new_events():
            if event.get("event") == "snapshot":
                self.snapshot = {k: event.get(k) for k in ("step", "epoch", "time")}
            if event.get("event") == "step":
                self.last_step = self.clock()
                if self.first_step is None:
                    self.first_step = self.last_step
                    self._set_phase("Running")
            line = apply_metric(self.state, event)
            if line:
                self.view.log(self.clock(), line)
        if self.state.phase == "Restarting" and not self.due and self.first_step is not None:
            if all(n.state in (RUNNING, SPARE) for n in self.state.nodes.values() if n.index in self.procs):
                self._set_phase("Running")

    def _scan_workers(self) -> None:
        """torchrun restarts of code that reports no steps (the trainer's `start` events count them otherwise)."""
        if self.state.starts_seen or self.clock() - self.scanned < WORKER_SCAN_SECONDS:
            return
        self.scanned = self.clock()
        for index, proc in self.procs.items():
            count, key = proc.worker_restarts(), (index, self.state.nodes[index].starts)
            if count is not None and count > self.worker_restarts.get(key, 0):
                self.worker_restarts[key] = count
                self.view.log(self.clock(), f"node {index}: torchrun restarted its workers (restart {count})")
        self.state.torchrun_restarts = sum(self.worker_restarts.values())

    def _maybe_kill(self) -> None:
        opts = self.options
        origin = 0.0 if opts.kill_from_start else self.first_step
        if opts.kill_after is None or self.killed or origin is None:
            return
        if self.clock() < origin + opts.kill_after:
            return
        index = opts.kill_node if opts.kill_node is not None else self.plan.replicas - 1
        proc = self.procs.get(index)
        if proc is None:
            return  # not running right now (backoff): try again on the next pass
        self.killed, self.killed_proc = True, proc
        since = "the start (no training step is reported)" if opts.kill_from_start else "the first training step"
        lost = " (--node-lost: its machine lost)" if opts.node_lost else ""
        self._event("killed", node=index, pid=proc.pid,
                    why=f"--kill-node-after {opts.kill_after:g} s after {since}{lost}")
        proc.kill()

    def _reap(self) -> None:
        for index, proc in list(self.procs.items()):
            code = proc.poll()
            if code is None or self.procs.get(index) is not proc:  # running, or stopped by a group restart
                continue
            del self.procs[index]
            proc.kill()  # workers an agent left behind, if any
            decision = self.budget.node_exited(index, code, started_at=proc.started_at,
                                               failed_at=datetime.now(timezone.utc),
                                               finished=self.finished_at is not None, snapshot=self.snapshot,
                                               lost=self.options.node_lost and proc is self.killed_proc)
            message, replace_at = decision.message, None
            if decision.action == Action.REPLACE and self._hosts_store(index):
                self._event("exited", node=index, code=code, action=decision.action.value, message=decision.what,
                            incidents=self.budget.charged, replace_at=self.clock() + decision.delay)
                self._group_restart(decision, f"{decision.what.replace('node 0', 'node 0 (the c10d store host)', 1)}")
                continue
            if decision.action == Action.REPLACE:
                replace_at = self.clock() + decision.delay
                self.due[index] = replace_at
                message += (f"; replacing it in {decision.delay:.0f} s" if decision.delay >= 0.5
                            else "; replacing it now")
                if index in self.spares:
                    message += " (a spare: training goes on without a pause)"
                else:
                    self.failed_at = self.clock()
                    self._set_phase("Restarting")
                    message += self._promote_spare(index)
            elif decision.action == Action.FINISHED and self.finished_at is None:
                self.finished_at = self.clock()
                self.due.clear()  # the rendezvous is closed: replacements could never join
                self._stop_spares()
            elif decision.action == Action.FAIL:
                self.failure = decision.message
            self._event("exited", node=index, code=code, action=decision.action.value, message=message,
                        incidents=self.budget.charged, replace_at=replace_at)

    def _promote_spare(self, lost: int) -> str:
        """The lowest running spare takes lost node `lost`'s place: the rendezvous lets it join the
        survivors' next round by itself (see the module docstring); here only the roles swap, so
        that `lost`'s replacement starts as the new spare. Returns what the message adds."""
        running = sorted(i for i in self.spares if i in self.procs)
        if not running:
            return ""
        spare = running[0]
        self.spares.discard(spare)
        self.spares.add(lost)
        self._event("promoted", node=spare, replaces=lost,
                    message=f"spare node {spare} joins the group in node {lost}'s place")
        return f" as the new spare (spare node {spare} takes its place)"

    def _stop_spares(self) -> None:
        """Training finished: a waiting spare has no group left to join (its agent would only
        leave once it read the closed rendezvous), so it is stopped now, not after finish_grace."""
        for index in sorted(self.spares & self.procs.keys()):
            stop_all([self.procs.pop(index)])
            self._event("stopped", node=index, why="training finished: a spare has no group left to join")

    def _hosts_store(self, index: int) -> bool:
        """Node `index` took the rendezvous down with it (node 0 hosting the c10d store)."""
        return (index == 0 and self.plan.spec.elastic_policy.store_on_node and len(self.plan.nodes) > 1
                and self.finished_at is None)

    def _group_restart(self, decision: Decision, what: str) -> None:
        """Every node restarts after the backoff under the next rendezvous generation."""
        self.generation += 1
        budget = (f"{self.budget.charged} of spec.failurePolicy.maxRestarts "
                  f"({self.plan.spec.failure_policy.max_restarts}) used")
        message = C.MSG_GROUP_RESTART.format(what=what, generation=self.generation, budget=budget)
        self._event("group_restart", generation=self.generation,
                    message=message.replace("node pods", "nodes") + f"; in {decision.delay:.0f} s")
        for index, proc in list(self.procs.items()):
            stop_all([proc])
            del self.procs[index]
            self._event("stopped", node=index, why=f"rendezvous generation {self.generation - 1} is gone")
        replace_at = self.clock() + decision.delay
        for node in self.plan.nodes:
            self.due[node.index] = replace_at
        self._set_phase("Restarting")

    def _start_store(self) -> None:
        if self.plan.store is None:
            return
        log_path = self.run_dir / "logs" / "rdzv-store.log"
        self.store = NodeProcess.start(self.plan.store, self.base_env, log_path, f"{self.plan.rdzv_id}.store")
        self._event("store_started", pid=self.store.pid)

    def _reap_store(self) -> None:
        code = self.store.poll() if self.store else None
        if code is None:
            return
        proc, self.store = self.store, None
        decision = self.budget.store_exited(code, started_at=proc.started_at, failed_at=datetime.now(timezone.utc),
                                            finished=self.finished_at is not None, snapshot=self.snapshot)
        self._event("store_exited", code=code, action=decision.action.value, message=decision.message)
        if decision.action == Action.FAIL:
            self.failure = decision.message
        elif decision.action == Action.REPLACE:
            self._start_store()  # the state is gone anyway; the nodes wait for the backoff
            self._group_restart(decision, decision.what)

    def _start_due(self) -> None:
        due = [index for index, at in self.due.items() if self.clock() >= at]
        if not due or self._survivors_reforming(due):
            return
        self.holding = False
        for index in due:
            del self.due[index]
            self._start(index)

    def _survivors_reforming(self, due: list[int]) -> bool:
        """Whether due replacements wait for the survivors (see policy.hold_replacements)."""
        ep = self.plan.spec.elastic_policy
        if not hold_replacements(now=self.clock(), failed_at=self.failed_at, first_step=self.first_step,
                                 last_step=self.last_step, running=len(self.procs.keys() - self.spares),
                                 min_replicas=self.plan.spec.min_replicas,
                                 survivors_wait=ep.ddpjob_rendezvous and ep.replacement_wait_seconds > 0):
            return False
        if not self.holding:
            self.holding = True
            nodes = ", ".join(str(i) for i in sorted(due))
            self._event("held", nodes=sorted(due),
                        message=f"replacement of node {nodes} waits until the surviving nodes resume training")
        return True

    def _stop_stragglers(self) -> None:
        if self.finished_at is None or self.clock() < self.finished_at + self.options.finish_grace:
            return
        for index, proc in list(self.procs.items()):
            stop_all([proc])
            del self.procs[index]
            self._event("stopped", node=index, why="training finished without it")

    # -- helpers ---------------------------------------------------------------

    def _start(self, index: int) -> None:
        node = self.plan.nodes[index]
        env = dict(node.env)
        if self.generation:
            env["PET_RDZV_ID"] = rdzv_id(self.plan.rdzv_id, self.generation)
        if index in self.spares:
            env[SPARE_ENV] = "1"  # its agent joins once a group trains: it waits outside the group
        node = LocalNode(node.index, node.argv, env, node.cwd)
        start = self.state.nodes[index].starts + 1
        log_path = self.run_dir / "logs" / f"node-{index}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "a", encoding="utf-8") as log:
            log.write(f"=== ddpjob run: node {index}, start {start}: {' '.join(node.argv)}\n")
        marker = f"{self.plan.rdzv_id}.node-{index}.{start}"
        if node.cwd is not None:
            node.cwd.mkdir(parents=True, exist_ok=True)
        proc = NodeProcess.start(node, self.base_env, log_path, marker, cwd=node.cwd)
        self.procs[index] = proc
        self._event("started", node=index, pid=proc.pid, start=start, rdzv_id=node.env["PET_RDZV_ID"],
                    spare=index in self.spares)

    def _stop_everything(self) -> None:
        """Stops every node; a second Ctrl-C or SIGTERM cannot cut this short and leave orphans."""
        main = threading.current_thread() is threading.main_thread()
        previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in STOP_SIGNALS} if main else {}
        try:
            running = list(self.procs.values())
            stop_all(running)
            for proc in running:
                self._event("stopped", node=proc.index, why="the run ended")
            self.procs.clear()
            self.due.clear()
            if self.store is not None:  # after the nodes: agents still shutting down talk to it
                stop_all([self.store])
                self._event("store_stopped", why="the run ended")
                self.store = None
            # Every incarnation's marker starts with the run's id: this also ends a node that a
            # Ctrl-C caught between its start and its entry in self.procs. Nothing the run
            # started may write into the run directory after the run ended.
            kill_marked_until_gone(f"{self.plan.rdzv_id}.", prefix=True)
            remove_fork_server_dirs(self.plan.nodes)
            remove_fast_tier_dirs(self.plan.nodes)
        finally:
            for sig, handler in previous.items():
                if handler is not None:  # None: a handler not set from Python, which cannot be put back
                    signal.signal(sig, handler)

    def _set_phase(self, phase: str) -> None:
        if self.state.phase != phase:
            self._event("phase", phase=phase)

    def _event(self, kind: str, **fields: Any) -> None:
        record = self.journal.write(kind, **fields)
        line = apply_node_event(self.state, record)
        if line and kind != "phase" or kind == "phase" and fields.get("message"):
            self.view.log(record["t"], line)

    def _timeline(self) -> list[str]:
        """The timeline files beside the summary; a full disk costs the picture, not the result."""
        try:
            return write_timeline(self.plan.job, self.run_dir, self.plan.metrics_file)
        except OSError as e:
            return [f"timeline not written to {self.run_dir}: {e.strerror or e}"]

    def _write_launch(self) -> None:
        nodes = [{"node": n.index, "argv": n.argv, "env": n.env, "cwd": str(n.cwd) if n.cwd else None}
                 for n in self.plan.nodes]
        (self.run_dir / "launch.json").write_text(json.dumps(
            {"job": self.plan.job, "rdzv_id": self.plan.rdzv_id, "nodes": nodes}, indent=2) + "\n")
