"""What happens when the node hosting torchrun's c10d rendezvous store dies.

With ``--rdzv_backend=c10d`` one agent hosts the TCP store that holds the
rendezvous state; every other agent polls it while its workers train. This
test records the failure mode the operator must heal, on real agents.
"""
from __future__ import annotations

import json
import time

from ddpjob_trainer.report.metrics import read_metrics
from ddpjob_trainer.snapshots.store import PROGRESS_FILE, SnapshotStore
from ddpjob_sandbox.torchrun import example_target, AgentGroup, Rendezvous
from ddpjob_sandbox.metrics import MetricsWatcher, is_event, read_events

EVENT_TIMEOUT = 120
# Observed here: the survivor exits ~2 s after the host dies; the bound is
# generous for a loaded machine and still far below any rendezvous timeout
# (join_timeout=60), so it proves the agent gives up instead of waiting.
SURVIVOR_EXIT_WITHIN = 30


def test_losing_the_store_host_ends_the_surviving_agent_and_leaves_the_snapshot_intact(tmp_path):
    """Kill the c10d store host (agent, workers: the whole node) while two nodes train.

    Observed outcome (torch 2.13, CPU/gloo): the surviving agent's monitor loop
    polls the store for waiting nodes, gets a refused connection, raises
    ``RendezvousConnectionError`` ("The connection to the C10d store has
    failed") and exits with code 1 within about 2 s, stopping its own worker;
    it does not restart and it spends none of its ``--max_restarts`` budget,
    because it never re-enters a rendezvous. No ``done`` event is written.
    The snapshot directory keeps the last complete snapshot, loadable and
    matching ``progress.json``, so a replacement job (new store host) can
    resume from it: that restart is the operator's job.
    """
    metrics = tmp_path / "metrics.jsonl"
    target = example_target(tmp_path, epochs=20, samples=512, step_sleep=0.15)
    with AgentGroup(tmp_path, Rendezvous.c10d(), target) as group:
        host = group.start("host", rdzv_conf_extra={"is_host": True})
        survivor = group.start("survivor", rdzv_conf_extra={"is_host": False})
        watcher = MetricsWatcher(metrics, group)
        watcher.wait(is_event("snapshot", step=lambda s: s > 0), EVENT_TIMEOUT, "the first snapshot")
        watcher.wait(is_event("step", world_size=2), EVENT_TIMEOUT, "a step after the first snapshot")

        host.kill()
        killed_at = time.monotonic()
        exit_code = survivor.wait(timeout=SURVIVOR_EXIT_WITHIN)
        took = time.monotonic() - killed_at
        leftover_workers = survivor.workers()
        log = survivor.log_path.read_text(errors="replace")

    assert exit_code == 1, f"survivor exited with {exit_code} after {took:.1f} s:\n{log[-3000:]}"
    assert "RendezvousConnectionError" in log and "C10d store has failed" in log, log[-3000:]
    assert leftover_workers == {}, f"survivor left workers running: {leftover_workers}"
    assert "will restart worker group" not in log, "survivor restarted instead of exiting"

    raw = read_events(metrics)
    assert not [event for event in raw if event["event"] == "done"], "the job cannot have finished"
    snapshot_events = [event for event in read_metrics(metrics) if event["event"] == "snapshot"]
    store = SnapshotStore(tmp_path / "snapshots", rank=1)  # rank != 0: reads only, never cleans up
    info, state = store.load_latest()
    assert (info.epoch, info.step) == (snapshot_events[-1]["epoch"], snapshot_events[-1]["step"])
    assert state["step"] == info.step and state["epoch"] == info.epoch and state["model"]
    progress = json.loads((tmp_path / "snapshots" / PROGRESS_FILE).read_text())
    assert (progress["epoch"], progress["step"], progress["path"]) == (info.epoch, info.step, info.path)
