"""What happens when the node hosting torchrun's c10d rendezvous store dies.

With ``--rdzv_backend=c10d`` one agent hosts the TCP store that holds the
rendezvous state; every other agent polls it while its workers train. This
test records the failure mode the operator must heal, on real agents, and what
the operator then learns from each node's termination message: each node's
local-rank-0 worker keeps the last complete snapshot there, the node without
rank 0 by copying progress.json from the shared volume, so the progress is
known from whichever node's container exits.
"""
from __future__ import annotations

import json
import time

from ddpjob_rdzv.contract import TERMINATION_LOG_ENV, progress_record
from ddpjob_trainer.report.metrics import read_metrics
from ddpjob_trainer.report.record import POLL_SECONDS
from ddpjob_trainer.snapshots.store import PROGRESS_FILE, SnapshotStore
from ddpjob_sandbox.torchrun import example_target, AgentGroup, Rendezvous
from ddpjob_sandbox.metrics import MetricsWatcher, is_event, read_events

EVENT_TIMEOUT = 120
# Observed here: the survivor exits ~2 s after the host dies; the bound is
# generous for a loaded machine and still far below any rendezvous timeout
# (join_timeout=60), so it proves the agent gives up instead of waiting.
SURVIVOR_EXIT_WITHIN = 30


def test_losing_the_store_host_ends_the_survivor_and_each_node_reports_the_intact_last_snapshot(tmp_path):
    """Kill the c10d store host (agent, workers: the whole node) while two nodes train.

    Observed outcome (torch 2.13, CPU/gloo): the surviving agent's monitor loop
    polls the store for waiting nodes, gets a refused connection, raises
    ``RendezvousConnectionError`` ("The connection to the C10d store has
    failed") and exits with code 1 within about 2 s, stopping its own worker;
    it does not restart and it spends none of its ``--max_restarts`` budget,
    because it never re-enters a rendezvous. No ``done`` event is written.
    The snapshot directory keeps the last complete snapshot, loadable and
    matching ``progress.json``, so a replacement job (new store host) can
    resume from it: that restart is the operator's job. Each node's
    termination message names a complete snapshot.
    """
    metrics = tmp_path / "metrics.jsonl"
    messages = {node: tmp_path / f"termination-log-{node}" for node in ("0", "1")}
    for path in messages.values():
        path.touch()  # the kubelet creates the file before the container starts
    target = example_target(tmp_path, epochs=40, samples=512, step_sleep=0.15)
    with AgentGroup(tmp_path, Rendezvous.c10d(), target) as group:
        agents = {}
        for node, name, is_host in (("0", "host", True), ("1", "survivor", False)):
            group.env.update({TERMINATION_LOG_ENV: str(messages[node]), "DDPJOB_NODE_INDEX": node})  # per agent
            agents[node] = group.start(name, rdzv_conf_extra={"is_host": is_host})
        host, survivor = agents["0"], agents["1"]
        watcher = MetricsWatcher(metrics, group)
        watcher.wait(is_event("snapshot", step=lambda s: s > 0), EVENT_TIMEOUT, "the first snapshot")
        time.sleep(POLL_SECONDS + 2)  # node 1 copies progress.json at most every POLL_SECONDS
        watcher.wait(is_event("snapshot"), EVENT_TIMEOUT, "a snapshot")
        watcher.wait(is_event("step", world_size=2), EVENT_TIMEOUT, "a step after it")

        host.kill()  # node 0 lost with its container: the kubelet still reports the file
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

    records = {node: progress_record.parse(path.read_text()).data for node, path in messages.items()}
    assert records["0"]["node"] == "0" and records["1"]["node"] == "1"
    # Node 0 (rank 0) writes its record right after progress.json; a kill in between leaves the previous one.
    assert records["0"]["snapshot"]["step"] in [s["step"] for s in snapshot_events[-2:]]
    assert records["0"]["snapshot"]["step"] <= progress["step"]
    # Node 1 copied a complete snapshot from the shared volume, at most POLL_SECONDS old.
    copied = records["1"]["snapshot"]
    assert copied is not None and copied["step"] > 0 and copied["step"] in [s["step"] for s in snapshot_events]
    assert copied["path"].endswith(f"snapshot-s{copied['step']:010d}-e{copied['epoch']:06d}.pt")
    for record in records.values():
        assert record["resume"]["fromStep"] is None and record["resume"]["firstStepTime"] > record["resume"]["time"]
