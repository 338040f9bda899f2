"""Real torchrun, two nodes: each node's local-rank-0 worker keeps the last complete snapshot in
its own termination message, the node without rank 0 by copying progress.json from the shared
volume, so the operator learns the progress from whichever node's container exits."""
from __future__ import annotations

import json
import time

from ddpjob_rdzv.contract import progress_record
from ddpjob_trainer.report.metrics import read_metrics
from ddpjob_rdzv.contract import TERMINATION_LOG_ENV
from ddpjob_trainer.report.record import POLL_SECONDS
from ddpjob_trainer.snapshots.store import PROGRESS_FILE
from ddpjob_sandbox.torchrun import example_target
from ddpjob_sandbox.torchrun import AgentGroup, Rendezvous
from ddpjob_sandbox.metrics import MetricsWatcher, is_event

EVENT_TIMEOUT = 120


def test_every_node_reports_the_last_snapshot_when_the_store_host_dies(tmp_path):
    messages = {node: tmp_path / f"termination-log-{node}" for node in ("0", "1")}
    for path in messages.values():
        path.touch()  # the kubelet creates the file before the container starts
    target = example_target(tmp_path, epochs=40, samples=512, step_sleep=0.15)
    with AgentGroup(tmp_path, Rendezvous.c10d(), target) as group:
        agents = {}
        for node, is_host in (("0", True), ("1", False)):
            group.env.update({TERMINATION_LOG_ENV: str(messages[node]), "DDPJOB_NODE_INDEX": node})  # per agent
            agents[node] = group.start(f"node{node}", rdzv_conf_extra={"is_host": is_host})
        watcher = MetricsWatcher(tmp_path / "metrics.jsonl", group)
        watcher.wait(is_event("snapshot", step=lambda s: s > 0), EVENT_TIMEOUT, "the first snapshot")
        time.sleep(POLL_SECONDS + 2)  # node 1 copies progress.json at most every POLL_SECONDS
        watcher.wait(is_event("snapshot"), EVENT_TIMEOUT, "a snapshot")
        agents["0"].kill()  # node 0 lost with its container: the kubelet still reports the file
        agents["1"].wait(timeout=30)

    snapshots = [e for e in read_metrics(tmp_path / "metrics.jsonl") if e["event"] == "snapshot"]
    progress = json.loads((tmp_path / "snapshots" / PROGRESS_FILE).read_text())
    records = {node: progress_record.parse(path.read_text()).data for node, path in messages.items()}
    assert records["0"]["node"] == "0" and records["1"]["node"] == "1"
    # Node 0 (rank 0) writes its record right after progress.json; a kill in between leaves the previous one.
    assert records["0"]["snapshot"]["step"] in [s["step"] for s in snapshots[-2:]]
    assert records["0"]["snapshot"]["step"] <= progress["step"]
    # Node 1 copied a complete snapshot from the shared volume, at most POLL_SECONDS old.
    copied = records["1"]["snapshot"]
    assert copied is not None and copied["step"] > 0 and copied["step"] in [s["step"] for s in snapshots]
    assert copied["path"].endswith(f"snapshot-s{copied['step']:010d}-e{copied['epoch']:06d}.pt")
    for record in records.values():
        assert record["resume"]["fromStep"] is None and record["resume"]["firstStepTime"] > record["resume"]["time"]
