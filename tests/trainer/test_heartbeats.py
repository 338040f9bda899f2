"""Per-rank liveness (ddpjob_trainer/report/record.py): every rank beats into the process group's
store from a thread of its own, and a node's reporter folds all the ranks into the record's
``nodes``, so the one record the operator polls shows a rank stuck outside a collective."""
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
import torch
import torch.distributed as torch_dist

from ddpjob_rdzv.contract import progress_record
from ddpjob_trainer import DoNotRetry, Trainer, TrainerConfig, do_not_retry
from ddpjob_rdzv.contract import COLLECTIVE_TIMEOUT_ENV
from ddpjob_trainer.dist import collective_timeout
from ddpjob_trainer.examples.mlp import make_dataset, mse
from ddpjob_trainer.report.give_up import stop_agent
from ddpjob_trainer.report.heartbeats import HEARTBEAT_PREFIX, HEARTBEAT_SECONDS, Heartbeats, StepClock, fold
from ddpjob_rdzv.contract import TERMINATION_LOG_ENV
from ddpjob_trainer.report.record import ProgressReport
from ddpjob_sandbox.procs import free_port


class Ticks:
    """A clock that moves only when told."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_the_step_clock_splits_a_step_into_input_forward_and_the_rest():
    ticks = Ticks()
    clock = StepClock(ticks)
    for data, forward, rest in [(0.5, 0.25, 1.0), (0.5, 0.25, 1.0), (3.0, 0.25, 1.0)]:
        ticks.now += data
        clock.batch_ready()
        ticks.now += forward
        clock.forward_done()
        ticks.now += rest
        clock.micro_step_done()
        clock.stepped()
    # medians over the window: one slow batch (3 s) is not a slow node
    assert clock.figures() == {"stepSeconds": 1.75, "dataSeconds": 0.5, "computeSeconds": 0.25}


def test_the_step_clock_reports_nothing_before_a_step():
    assert StepClock(Ticks()).figures() == {}


def beat(node, step, phase="collective", heartbeat="2026-11-24T01:00:00.000Z", data=0.01, compute=0.02):
    return {"node": node, "step": step, "phase": phase, "heartbeat": heartbeat, "stepSeconds": 0.5,
            "dataSeconds": data, "computeSeconds": compute}


def test_fold_gives_one_entry_per_node_with_its_laggard_rank():
    beats = [beat("1", 40, data=0.01), beat("1", 39, phase="local", heartbeat="2026-11-24T00:59:00.000Z", data=0.3),
             beat("0", 40), beat("10", 40), beat("2", 40)]
    nodes = fold(beats)
    assert [n["node"] for n in nodes] == ["0", "1", "2", "10"]
    assert nodes[1] == {"node": "1", "step": 39, "phase": "local", "heartbeat": "2026-11-24T00:59:00.000Z",
                        "stepSeconds": 0.5, "dataSeconds": 0.3, "computeSeconds": 0.02}
    record = {**progress_record.new_record("0", progress_record.now()), "nodes": nodes}
    assert isinstance(progress_record.validate(record), progress_record.Record)


def test_128_nodes_of_figures_fit_in_the_record():
    nodes = fold([beat(str(i), progress_record.MAX_COUNT, phase="local", data=12345.6789, compute=12345.6789)
                  for i in range(200)])
    assert len(nodes) == progress_record.MAX_NODES
    record = {**progress_record.new_record("0", progress_record.now()), "nodes": nodes,
              "error": "x" * progress_record.MAX_ERROR_CHARS}
    data = progress_record.encode(record)
    assert json.loads(data)["nodes"] == nodes, "the nodes were dropped to fit"


def store():
    return torch_dist.TCPStore("127.0.0.1", free_port(), is_master=True, wait_for_workers=False)


def test_every_rank_beats_from_its_own_thread_while_its_training_thread_is_stuck():
    server = store()
    ranks = [Heartbeats(server, rank, 3, node) for rank, node in enumerate(["0", "0", "1"])]
    for hb in ranks:
        hb.start(step=7)
    ranks[0].stepped(8)
    ranks[1].stepped(8)
    ranks[0].in_collective()  # ranks 0 and 1 wait in a collective, rank 2 never finished step 8
    ranks[1].in_collective()
    time.sleep(HEARTBEAT_SECONDS * 2.5)  # the threads beat meanwhile; nobody calls beat()
    nodes = ranks[0].gather()
    for hb in ranks:
        hb.stop()
    assert [(n["node"], n["step"], n["phase"]) for n in nodes] == [("0", 8, "collective"), ("1", 7, "local")]
    assert json.loads(server.get(HEARTBEAT_PREFIX + "2"))["step"] == 7


def test_a_rank_that_never_beat_is_left_out_rather_than_waited_for():
    server = store()
    Heartbeats(server, 0, 2, "0").beat()
    started = time.monotonic()
    assert [n["node"] for n in Heartbeats(server, 0, 2, "0").gather()] == ["0"]
    assert time.monotonic() - started < 5  # a get() of rank 1's key would wait for the store's timeout


def test_the_reporter_serves_every_nodes_heartbeat_at_the_endpoint(tmp_path):
    server = store()
    ranks = [Heartbeats(server, rank, 2, str(rank)) for rank in range(2)]
    for hb in ranks:
        hb.start(step=3)
    report = ProgressReport(None, None, node="0", port=0)
    report.refresh(force=True)  # the Trainer publishes the record at start (resumed)
    report.watch(ranks[0])
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            body = urllib.request.urlopen(f"http://127.0.0.1:{report.port}/progress", timeout=5).read()
            nodes = json.loads(body).get("nodes") or []
            if len(nodes) == 2:
                break
            time.sleep(0.2)
    finally:
        report.close()
        for hb in ranks:
            hb.stop()
    assert [(n["node"], n["step"]) for n in nodes] == [("0", 3), ("1", 3)]


def test_the_trainer_beats_its_steps_into_the_group_store(env, tmp_path, monkeypatch):
    monkeypatch.setenv("DDPJOB_NODE_INDEX", "4")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 4))
    config = TrainerConfig(epochs=1, batch_size=8, progress_bar=False, metrics_file=str(tmp_path / "m.jsonl"))
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.01), make_dataset(64, seed=1), config,
                      loss_fn=mse, env=env)
    trainer.train()
    trainer.heartbeats.beat()
    beat = json.loads(torch_dist.distributed_c10d._get_default_store().get(HEARTBEAT_PREFIX + "0"))
    assert (beat["node"], beat["step"], beat["phase"]) == ("4", 8, "local")
    assert beat["stepSeconds"] > 0 and beat["computeSeconds"] > 0 and beat["dataSeconds"] >= 0


@pytest.mark.parametrize(("value", "seconds"), [("", 600.0), ("45", 45.0), ("2.5", 2.5)])
def test_the_collective_timeout_comes_from_the_environment(value, seconds):
    assert collective_timeout({COLLECTIVE_TIMEOUT_ENV: value}).total_seconds() == seconds


@pytest.mark.parametrize("value", ["0", "-3", "soon", "nan", "inf"])
def test_a_nonsense_collective_timeout_is_refused_with_its_rule(value):
    with pytest.raises(ValueError) as raised:
        collective_timeout({COLLECTIVE_TIMEOUT_ENV: value})
    assert str(raised.value) == f"DDPJOB_COLLECTIVE_TIMEOUT_SECONDS ({value!r}) must be a number of seconds above 0"


def test_do_not_retry_writes_fatal_and_raises(tmp_path, monkeypatch):
    message = tmp_path / "termination-log"
    message.touch()
    monkeypatch.setenv(TERMINATION_LOG_ENV, str(message))
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)  # not under torchrun: nothing to stop
    with pytest.raises(DoNotRetry) as raised:
        do_not_retry("the loss is NaN since step 400", reason="NanLoss")
    assert raised.value.reason == "NanLoss"
    record = json.loads(message.read_text())
    assert record["fatal"] == {"reason": "NanLoss", "message": "the loss is NaN since step 400"}


def test_the_reporting_rank_keeps_a_fatal_another_local_rank_wrote(tmp_path):
    message = tmp_path / "termination-log"
    message.touch()
    report = ProgressReport(message, None, node="0")
    ProgressReport(message, None, node="0").failed(DoNotRetry("bad shard 3", reason="BadDataset"))
    report.refresh(force=True)  # the reporting rank writes its own record afterwards
    assert json.loads(message.read_text())["fatal"] == {"reason": "BadDataset", "message": "bad shard 3"}


AGENT = """
import os, subprocess, sys, time
child = subprocess.run([sys.executable, "-c", "from ddpjob_trainer.report.give_up import stop_agent; "
                        "print(stop_agent(), flush=True)"], env=dict(os.environ, TORCHELASTIC_RUN_ID=sys.argv[2]))
time.sleep(30)  # a real agent would restart its workers here
"""


def assert_agent_stopped(tmp_path, script: str, *args: str, stopped: bool) -> None:
    """Runs `script` as a pretend torchrun agent in a pod (a termination log exists) whose worker calls
    stop_agent: the worker says whether it signalled, and a signalled agent dies of SIGTERM."""
    message = tmp_path / "termination-log"
    message.touch()
    agent = subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ, **{TERMINATION_LOG_ENV: str(message)}))
    try:
        said = agent.stdout.readline().strip()
        code = agent.wait(timeout=10) if stopped else None
    finally:
        agent.kill()
        agent.wait()
    assert said == str(stopped)
    if stopped:
        assert code == -signal.SIGTERM


@pytest.mark.parametrize(("name", "run_id", "stopped"), [("torchrun", "job-1", True), ("torchrun", "", False),
                                                         ("python", "job-1", False)])
def test_the_agent_is_stopped_only_when_the_parent_is_torchrun_under_a_job(tmp_path, name, run_id, stopped):
    assert_agent_stopped(tmp_path, AGENT, name, run_id, stopped=stopped)


# The agent starts a fork server (a plain Python) that starts the worker, as ddpjob_trainer.zygote does:
# the worker's parent is not torchrun, and only the agent's pid in its environment leads to the agent.
ZYGOTE_AGENT = """
import os, subprocess, sys, time
worker = "from ddpjob_trainer.report.give_up import stop_agent; print(stop_agent(), flush=True)"
server = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {worker!r}])"
named = {"DDPJOB_AGENT_PID": str(os.getpid())} if sys.argv[2] == "named" else {}
subprocess.run([sys.executable, "-c", server], env=dict(os.environ, TORCHELASTIC_RUN_ID="job-1", **named))
time.sleep(30)  # a real agent would restart its workers here
"""


@pytest.mark.parametrize(("named", "stopped"), [("named", True), ("unnamed", False)])
def test_a_worker_forked_by_the_zygote_stops_the_agent_its_client_names(tmp_path, named, stopped):
    assert_agent_stopped(tmp_path, ZYGOTE_AGENT, "torchrun", named, stopped=stopped)


@pytest.mark.parametrize(("world_size", "seconds"), [(2, 1.0), (64, 1.0), (640, 10.0)])
def test_a_large_group_is_gathered_less_often(world_size, seconds):
    # Every node's reporter reads every rank's key: the store's load grows with the square of the size.
    assert Heartbeats(None, 0, world_size, "0").gather_seconds == seconds


@pytest.mark.parametrize("bad", [
    b'{"node": "1", "step": 3, "dataSeconds": "x"}',  # a string where a number goes: fold raised TypeError
    b'{"node": "1", "heartbeat": 5}',
    b'{"node": "1", "step": NaN}',
    b'not json',
])
def test_a_malformed_heartbeat_is_skipped_and_the_gatherer_keeps_going(bad, caplog):
    server = store()
    good = Heartbeats(server, 0, 2, "0")
    good.start(step=3)
    server.set(HEARTBEAT_PREFIX + "1", bad)  # rank 1's key, written by anything that reaches the store
    report = ProgressReport(None, None, node="0", port=0)
    report.refresh(force=True)
    report.watch(good)
    try:
        assert wait_for_nodes(report, 1) == [("0", 3)], "the good beat is reported, the bad one skipped"
        assert "skipping the heartbeat at ddpjob/heartbeat/1" in caplog.text
        Heartbeats(server, 1, 2, "1").beat()  # rank 1 beats properly again
        assert wait_for_nodes(report, 2) == [("0", 3), ("1", None)], "the gatherer outlived the bad beat"
    finally:
        report.close()
        good.stop()


def wait_for_nodes(report, count, timeout=10):
    deadline = time.monotonic() + timeout
    while True:
        body = urllib.request.urlopen(f"http://127.0.0.1:{report.port}/progress", timeout=5).read()
        nodes = [(n["node"], n.get("step")) for n in json.loads(body).get("nodes") or []]
        if len(nodes) == count or time.monotonic() > deadline:
            return nodes
        time.sleep(0.2)
