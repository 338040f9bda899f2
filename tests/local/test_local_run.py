"""`ddpjob run` end to end: real torchrun agents training the example job on loopback.

Each test starts few processes (one or two nodes); waits are bounded by the run
itself, which ends on its own (success or the failure policy's verdict).
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from ddpjob_operator import cli
from ddpjob_operator.local.command import EXIT_INTERRUPTED, EXIT_JOB_FAILED
from ddpjob_operator.local.procs import kill_marked_until_gone, marked_pids
from tests.local.test_local_timeline import svg_texts
from tests.support.elastic_checks import assert_ran_exactly_once, assert_resumed_from_snapshots, steps_redone
from ddpjob_sandbox.examples import load_example, write_manifest
from ddpjob_sandbox.metrics import read_events

DDPJOB = Path(sys.executable).parent / "ddpjob"


RUN_ARGS = ["--epochs", "4", "--samples", "2048", "--batch-size", "32", "--snapshot-every-epochs", "1",
            "--snapshot-every-steps", "10", "--step-sleep", "0.03"]


def job_file(tmp_path, *, args=None, replicas=None, failure_policy=None, elastic=None):
    """The example job with test-speed changes (fewer epochs, a short backoff)."""
    job = load_example()
    spec = job["spec"]
    spec["args"] = args or RUN_ARGS
    spec["failurePolicy"].update({"backoffSeconds": 2, **(failure_policy or {})})
    spec["elasticPolicy"].update(elastic or {})
    if replicas is not None:
        spec["replicas"] = replicas
    return str(write_manifest(job, tmp_path / "job.yaml"))


def events(run_dir):
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def run_marker(run_dir):
    """The start of every node marker of this run: the run's rendezvous id."""
    return json.loads((run_dir / "launch.json").read_text())["rdzv_id"] + "."


def leftovers(run_dir):
    """Live processes of this run."""
    return marked_pids(run_marker(run_dir), prefix=True)


def logs(run_dir):
    return "\n".join(p.read_text()[-2000:] for p in sorted((run_dir / "logs").glob("*.log")))


# The default arguments, and a survivor alone that holds after its first step until the replacement
# joins (the example's --wait-for-world-size): the replacement then joins mid-training however
# slow the machine, instead of after training finished alone.
JOINS_MID_TRAINING = RUN_ARGS + ["--wait-for-world-size", "2"]


def test_a_killed_node_is_replaced_and_training_resumes_from_its_snapshot(tmp_path, capsys):
    run_dir = tmp_path / "run"
    code = cli.main(["run", job_file(tmp_path, args=JOINS_MID_TRAINING), "--workdir", str(run_dir), "--port", "0",
                     "--plain", "--kill-node-after", "2"])
    out = capsys.readouterr().out
    assert code == 0, out + logs(run_dir)

    node1 = [(e["event"], e.get("code"), e.get("action")) for e in events(run_dir) if e.get("node") == 1]
    assert node1[:5] == [("started", None, None), ("killed", None, None), ("exited", 137, "replace"),
                         ("started", None, None), ("exited", 0, "finished")], node1
    by_kind = {(e["event"], e.get("node"), e.get("start")): e for e in events(run_dir)}
    exited = next(e for e in events(run_dir) if e["event"] == "exited" and e.get("code") == 137)
    killed = next(e for e in events(run_dir) if e["event"] == "killed")
    snapshots = [e for e in read_events(run_dir / "snapshots" / "metrics.jsonl")
                 if e["event"] == "snapshot" and e["time"] < killed["time"]]
    if snapshots:  # as in the operator: a failure after a newer snapshot is not charged
        assert exited["message"] == ("node 1 failed (exit code 137, SIGKILL); 0 of "
                                     "spec.failurePolicy.maxRestarts (5) used; not charged: a newer snapshot "
                                     f"(step {snapshots[-1]['step']}) was complete; replacing it now")
    else:
        assert exited["message"].startswith("node 1 failed (exit code 137, SIGKILL); 1 of spec.failurePolicy.maxRestarts")
    # The job's first incident is no crash loop: no backoff (the second in a row would wait 2 s).
    assert exited["message"].endswith("; replacing it now"), exited["message"]

    # The replacement waits for the survivors' resumed step instead: held while they re-form.
    held = [e for e in events(run_dir) if e["event"] == "held"]
    assert all(e["nodes"] == [1] and by_kind[("started", 1, 2)]["t"] > e["t"] for e in held), held

    metrics = run_dir / "snapshots" / "metrics.jsonl"
    raw = assert_ran_exactly_once(metrics, epochs=4)
    assert assert_resumed_from_snapshots(raw), "the run must have resumed at least once"
    # The survivor resumed alone before the replacement started; then the two trained together.
    assert [e["world_size"] for e in raw if e["event"] == "start"] == [2, 1, 2]
    assert "each trained exactly once in the effective history: yes" in out
    assert "training resumed from the snapshot at epoch" in out and "as a replacement" in out
    assert out.rstrip().endswith("Succeeded: training finished; 1 failure incident(s) recovered from")
    assert leftovers(run_dir) == []

    # Beside the summary, the timeline: the same starts, the kill and the pause, drawn in words.
    assert f"timeline: {run_dir / 'timeline.svg'} (data: timeline.json)" in out
    timeline = json.loads((run_dir / "timeline.json").read_text())
    assert [run["world_size"] for run in timeline["runs"]] == [e["world_size"] for e in raw if e["event"] == "start"]
    assert [mark["label"] for mark in timeline["kills"]] == ["kill node 1"] and timeline["pauses"]
    assert [step for _, step in timeline["snapshots"]] == [e["step"] for e in raw if e["event"] == "snapshot"]
    assert any(text.startswith("kill node 1") for text in svg_texts(run_dir / "timeline.svg"))


def test_a_short_run_writes_its_timeline_picture_beside_the_summary(tmp_path, capsys):
    run_dir = tmp_path / "run"
    args = ["--epochs", "1", "--samples", "256", "--batch-size", "32", "--snapshot-every-steps", "4"]
    code = cli.main(["run", job_file(tmp_path, args=args, replicas=1), "--workdir", str(run_dir), "--port", "0",
                     "--plain"])
    out = capsys.readouterr().out
    assert code == 0, out + logs(run_dir)
    lines = out.splitlines()
    # The picture's line comes right after the summary, before the verdict.
    assert lines[-2] == f"timeline: {run_dir / 'timeline.svg'} (data: timeline.json)"
    timeline = json.loads((run_dir / "timeline.json").read_text())
    assert timeline["phase"] == "Succeeded" and [run["world_size"] for run in timeline["runs"]] == [1]
    assert [step for _, step in timeline["runs"][0]["steps"]] == list(range(1, 9))
    assert [step for _, step in timeline["snapshots"]][:2] == [4, 8]
    assert "ddpjob run mlp: Succeeded" in " ".join(svg_texts(run_dir / "timeline.svg"))


def shipped_args_with(**values: str) -> list[str]:
    """The example's own arguments (the fast tier's included), with ``values`` (``epochs="2"``
    for --epochs) in place of the example's."""
    args = list(load_example()["spec"]["args"])
    for name, value in values.items():
        args[args.index("--" + name.replace("_", "-")) + 1] = value
    return args


def test_the_shipped_example_loses_at_most_the_step_in_flight_to_a_node_kill(tmp_path, capsys):
    """`make demo`: node 1's whole tree SIGKILLed mid-training. With the example's fast tier the
    survivor resumes from its own copy of the newest step, the replacement from a broadcast."""
    run_dir = tmp_path / "run"
    args = shipped_args_with(epochs="2")
    code = cli.main(["run", job_file(tmp_path, args=args), "--workdir", str(run_dir), "--port", "0", "--plain",
                     "--kill-node-after", "2"])
    out = capsys.readouterr().out
    assert code == 0, out + logs(run_dir)
    assert [e["event"] for e in events(run_dir) if e.get("node") == 1][:2] == ["started", "killed"]
    raw = assert_ran_exactly_once(run_dir / "snapshots" / "metrics.jsonl", epochs=2)
    assert len(steps_redone(raw)) <= 1, f"steps trained twice: {steps_redone(raw)}"
    assert "resumed from the fast tier" in "\n".join(p.read_text() for p in (run_dir / "logs").glob("*.log"))


def test_a_permanent_exit_code_fails_the_run_with_the_reason(tmp_path, capsys):
    run_dir = tmp_path / "run"
    path = job_file(tmp_path, replicas=1, failure_policy={"permanentExitCodes": [1]},
                    args=["--epochs", "2", "--samples", "512", "--fail-at-step", "3"],
                    elastic={"maxRestarts": 0})
    code = cli.main(["run", path, "--workdir", str(run_dir), "--port", "0", "--plain"])
    out = capsys.readouterr().out
    assert code == EXIT_JOB_FAILED, out + logs(run_dir)
    assert out.rstrip().endswith(
        "Failed: node 0 failed (exit code 1); the code is in spec.failurePolicy.permanentExitCodes")
    assert [e["event"] for e in events(run_dir) if e.get("node") == 0] == ["started", "exited"]
    assert leftovers(run_dir) == []


def test_a_spent_restart_budget_fails_the_run(tmp_path, capsys):
    run_dir = tmp_path / "run"
    path = job_file(tmp_path, replicas=1, failure_policy={"maxRestarts": 0},
                    args=["--epochs", "2", "--samples", "512", "--fail-at-step", "3"],
                    elastic={"maxRestarts": 0})
    code = cli.main(["run", path, "--workdir", str(run_dir), "--port", "0", "--plain"])
    out = capsys.readouterr().out
    assert code == EXIT_JOB_FAILED, out + logs(run_dir)
    assert out.rstrip().endswith("Failed: 1 failure incidents exceed spec.failurePolicy.maxRestarts (0)")
    assert leftovers(run_dir) == []


def test_ctrl_c_stops_every_process_of_every_node(tmp_path):
    run_dir = tmp_path / "run"
    path = job_file(tmp_path, replicas=1, args=["--epochs", "50", "--samples", "512", "--step-sleep", "0.05"])
    with open(tmp_path / "out.txt", "wb") as out:
        # Its own session: SIGINT goes to ddpjob alone, never to the nodes. Started with SIGINT
        # ignored, as a shell starts a script's background job (`ddpjob run ... &`, or a bench such
        # a job runs): Python keeps an inherited ignored SIGINT ignored, so ddpjob must install its
        # own handler, or the Ctrl-C never arrives and the run trains on (bench recovery hit that).
        proc = subprocess.Popen([str(DDPJOB), "run", path, "--workdir", str(run_dir), "--port", "0"],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        metrics = run_dir / "snapshots" / "metrics.jsonl"
        deadline = time.monotonic() + 60
        while not (metrics.exists() and '"step"' in metrics.read_text()):
            assert time.monotonic() < deadline and proc.poll() is None, (tmp_path / "out.txt").read_text()
            time.sleep(0.2)
        assert leftovers(run_dir), "the node's agent and worker run"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == EXIT_INTERRUPTED
    finally:
        if proc.poll() is None:  # the Ctrl-C did not stop it: end it, and its nodes (sessions of their own)
            os.killpg(proc.pid, signal.SIGKILL)
            kill_marked_until_gone(run_marker(run_dir), prefix=True)
    assert leftovers(run_dir) == []
    phases = [e.get("phase") for e in events(run_dir) if e["event"] == "phase"]
    assert phases[-1] == "Interrupted"
    assert any(e["event"] == "stopped" and e["node"] == 0 for e in events(run_dir))


@pytest.mark.slow  # ~45 s alone, ~65 s on a loaded machine: every node restarts
def test_losing_node_0_restarts_the_whole_group_under_the_next_rendezvous_generation(tmp_path, capsys):
    run_dir = tmp_path / "run"
    code = cli.main(["run", job_file(tmp_path, elastic={"rdzvStore": "node"}), "--workdir", str(run_dir),
                     "--port", "0", "--plain", "--kill-node-after", "2", "--kill-node", "0"])
    out = capsys.readouterr().out
    assert code == 0, out + logs(run_dir)
    log = events(run_dir)
    restart = next(e for e in log if e["event"] == "group_restart")
    assert restart["generation"] == 1
    assert restart["message"].startswith("node 0 (the c10d store host) failed (exit code 137, SIGKILL): "
                                         "restarting all nodes together under rendezvous generation 1")
    assert any(e["event"] == "stopped" and e["node"] == 1 for e in log), "node 1 is stopped, not left to time out"
    restarted = [e for e in log if e["event"] == "started" and e["t"] > restart["t"]]
    assert sorted(e["node"] for e in restarted) == [0, 1]
    assert {e["rdzv_id"] for e in restarted} == {log[0]["rdzv_id"] + "-1"}
    assert "1 failure incident(s) recovered from" in out
    assert_ran_exactly_once(run_dir / "snapshots" / "metrics.jsonl", epochs=4)
    assert leftovers(run_dir) == []


@pytest.mark.slow  # ~40 s alone, ~65 s on a loaded machine: a third process kind (the store) starts
def test_with_a_store_process_losing_node_0_replaces_only_node_0(tmp_path, capsys):
    run_dir = tmp_path / "run"
    code = cli.main(["run", job_file(tmp_path, elastic={"rdzvStore": "pod"}), "--workdir", str(run_dir),
                     "--port", "0", "--plain", "--kill-node-after", "2", "--kill-node", "0"])
    out = capsys.readouterr().out
    assert code == 0, out + logs(run_dir)
    log = events(run_dir)
    assert [e["event"] for e in log if e["event"].startswith("store")] == ["store_started", "store_stopped"]
    assert not any(e["event"] == "group_restart" for e in log)
    assert [e["event"] for e in log if e.get("node") == 1] == ["started", "exited"], "node 1 kept running"
    assert [e["event"] for e in log if e.get("node") == 0][:4] == ["started", "killed", "exited", "started"]
    assert_ran_exactly_once(run_dir / "snapshots" / "metrics.jsonl", epochs=4)
    assert leftovers(run_dir) == []


def test_the_active_deadline_fails_the_run_and_stops_the_nodes(tmp_path, capsys):
    run_dir = tmp_path / "run"
    path = job_file(tmp_path, replicas=1, args=["--epochs", "50", "--samples", "512", "--step-sleep", "0.05"])
    job = yaml.safe_load(Path(path).read_text())
    job["spec"]["runPolicy"]["activeDeadlineSeconds"] = 4
    Path(path).write_text(yaml.safe_dump(job))
    code = cli.main(["run", path, "--workdir", str(run_dir), "--port", "0", "--plain"])
    out = capsys.readouterr().out
    assert code == EXIT_JOB_FAILED, out
    assert out.rstrip().endswith("Failed: the job ran longer than spec.runPolicy.activeDeadlineSeconds (4)")
    assert [e["event"] for e in events(run_dir) if e.get("node") == 0] == ["started", "stopped"]
    assert leftovers(run_dir) == []
