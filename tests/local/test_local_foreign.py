"""`ddpjob run` with code of your own: a plain-torch script shaped like the DDP tutorial's
(tests/byo_scripts/tutorial_multinode.py) and the same script adopting ddpjob_trainer.Job.

Fast: where the nodes work, what --kill-node-after counts from, the status line without
progress. Slow (real torchrun): a killed node's replacement resumes from the script's last
save in the run's working directory, charged as an incident; with Job, a failure after a
snapshot is not charged.
"""
import argparse
import json
import re
import sys
from pathlib import Path

import pytest
import yaml

from ddpjob_operator import cli
from ddpjob_operator.api.validation import parse_spec
from ddpjob_operator.local.command import header, reports_progress
from ddpjob_operator.local.plan import local_plan
from ddpjob_operator.local.state import RunState, apply_metric, apply_node_event
from ddpjob_operator.local.view import progress
from ddpjob_sandbox.examples import load_example, write_manifest
from ddpjob_sandbox.metrics import read_events

SCRIPTS = Path(__file__).resolve().parents[1] / "byo_scripts"
PLAIN = SCRIPTS / "tutorial_multinode.py"
WITH_JOB = SCRIPTS / "tutorial_job.py"


def tutorial_job(script, *, args=("10", "1"), step_sleep="0.05", max_restarts=5, snapshot=True):
    """The example DDPJob running `script` instead of the example trainer."""
    body = load_example()
    body["metadata"]["name"] = "tut"
    spec = body["spec"]
    del spec["module"]
    spec.update(script=str(script), args=list(args), env=[{"name": "TUTORIAL_STEP_SLEEP", "value": step_sleep}])
    spec["failurePolicy"].update(backoffSeconds=2, maxRestarts=max_restarts)
    if not snapshot:
        del spec["snapshot"]
    return body


def plan_of(body, run_dir):
    return local_plan("tut", parse_spec(body["spec"]), rdzv_id="r", run_dir=run_dir, torchrun="/venv/bin/torchrun")


def test_a_script_job_works_in_the_runs_snapshot_directory_with_its_script_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(SCRIPTS)
    plan = plan_of(tutorial_job("tutorial_multinode.py"), tmp_path / "run")
    assert {node.cwd for node in plan.nodes} == {tmp_path / "run" / "snapshots" / "work"}
    assert plan.nodes[0].argv[1:] == [str(PLAIN), "10", "1"]


def test_without_a_snapshot_volume_a_script_job_works_in_the_run_directory(tmp_path):
    plan = plan_of(tutorial_job(PLAIN, snapshot=False), tmp_path / "run")
    assert plan.nodes[0].cwd == tmp_path / "run" / "work"


def test_a_module_job_keeps_the_callers_directory_for_python_dash_m(tmp_path):
    assert {node.cwd for node in plan_of(load_example(), tmp_path / "run").nodes} == {None}


def test_kill_node_after_counts_from_the_start_for_code_that_reports_no_steps(tmp_path):
    args = argparse.Namespace(kill_node_after=8.0, kill_node=None, node_lost=False)
    plain, api = (plan_of(tutorial_job(script), tmp_path / "run") for script in (PLAIN, WITH_JOB))
    assert (reports_progress(plain.spec), reports_progress(api.spec)) == (False, True)
    assert header(plain, tmp_path, args)[-2] == ("will SIGKILL node 1 8 s after the start (the code does not use "
                                                "ddpjob_trainer, so no training step is reported)")
    assert header(api, tmp_path, args)[-2] == "will SIGKILL node 1 8 s after the first training step"
    assert header(api, tmp_path, args)[-1] == (f"working directory {tmp_path}/run/snapshots/work: relative paths "
                                               "the script saves land here (a new run gets a new one)")


def test_the_status_line_shows_nodes_and_time_until_a_step_is_reported():
    state = RunState.new("tut", 2, max_incidents=5)
    apply_node_event(state, {"event": "started", "node": 0, "pid": 10})
    assert progress(state, now=41.2) == ("tut  Started  nodes 1/2 up  41 s since start  no training progress "
                                         "reported (ddpjob_trainer.Job reports it)")
    apply_metric(state, {"event": "step", "epoch": 0, "step": 1, "loss": 0.5, "world_size": 1})
    assert progress(state, now=42.0) == "tut  Pending  world size 1  epoch 0  step 1  loss 0.5000"


def run(tmp_path, body, *extra):
    run_dir = tmp_path / "run"
    code = cli.main(["run", str(write_manifest(body, tmp_path / "job.yaml")), "--workdir", str(run_dir),
                     "--port", "0", "--plain", *extra])
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    return code, run_dir, events


def node_log(run_dir, index):
    return (run_dir / "logs" / f"node-{index}.log").read_text()


@pytest.mark.slow  # ~60 s: two torchrun nodes, a kill, a replacement
def test_the_plain_tutorial_script_resumes_from_its_last_save_after_a_killed_node(tmp_path, capsys):
    code, run_dir, events = run(tmp_path, tutorial_job(PLAIN, args=("16", "1")), "--kill-node-after", "25")
    out = capsys.readouterr().out
    assert code == 0, out + node_log(run_dir, 0)[-3000:]
    killed = next(e for e in events if e["event"] == "killed")
    assert killed["why"] == "--kill-node-after 25 s after the start (no training step is reported)"
    exited = next(e for e in events if e["event"] == "exited" and e["code"] == 137)
    assert "1 of spec.failurePolicy.maxRestarts (5) used" in exited["message"], "no progress seen: charged"
    work = run_dir / "snapshots" / "work"  # the plan's cwd for a script (test above)
    assert (work / "snapshot.pt").is_file() and not (Path.cwd() / "snapshot.pt").exists()
    first, replacement = node_log(run_dir, 1).split("=== ddpjob run: node 1, start 2")
    resumed = [int(n) for n in re.findall(r"Resuming training from snapshot at Epoch (\d+)", replacement)]
    # Node 0 survived: its workers restarted and loaded the same file; rank 0 (either node) saved before.
    before, _, after = node_log(run_dir, 0).partition("Resuming training from snapshot at Epoch")
    saved_before = [int(n) for n in re.findall(r"Epoch (\d+) \| Training snapshot saved", before + first)]
    # The tutorial stores the epoch it finished and runs it again; never epoch 0 after this much training.
    assert resumed and resumed[0] == int(after.split()[0]) == max(saved_before) >= 1, (resumed, saved_before)
    assert re.search(r"tut  Started  nodes 2/2 up  \d+ s since start", out), out


@pytest.mark.slow  # ~60 s
def test_with_job_the_script_reports_steps_and_a_failure_after_a_snapshot_is_not_charged(tmp_path, capsys):
    code, run_dir, events = run(tmp_path, tutorial_job(WITH_JOB, max_restarts=0), "--kill-node-after", "6")
    out = capsys.readouterr().out
    assert code == 0, out + node_log(run_dir, 0)[-3000:]
    exited = next(e for e in events if e["event"] == "exited" and e["code"] == 137)
    assert "0 of spec.failurePolicy.maxRestarts (0) used; not charged: a newer snapshot" in exited["message"]
    metrics = read_events(run_dir / "snapshots" / "metrics.jsonl")
    killed = next(e for e in events if e["event"] == "killed")
    before = [e["epoch"] for e in metrics if e["event"] == "snapshot" and e["time"] < killed["time"]]
    restart = next(e for e in metrics if e["event"] == "start" and e["time"] > killed["time"])
    assert restart["resume_epoch"] == before[-1] >= 1, "resumed at the epoch after the last save"
    assert re.search(r"tut  Running  world size \d  epoch \d+  step \d+", out), out
