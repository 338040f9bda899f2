"""Real torchrun agents on ``--rdzv_backend=etcd-v3`` against a real etcd: training, faults, reuse of an id."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from ddpjob_rdzv import delete_rendezvous
from ddpjob_sandbox.etcd import running_etcd
from ddpjob_sandbox.torchrun import FAST_RDZV_CONF, AgentGroup, Rendezvous, unique_run_id
from ddpjob_sandbox.metrics import MetricsWatcher, is_event, read_events

WORKER = Path(__file__).with_name("worker.py")


@pytest.fixture()
def etcd():
    with running_etcd() as server:
        yield server


def make_job(tmp_path: Path, etcd, *, nnodes: str = "1:3", steps: int = 30, step_sleep: float = 0.2,
             run_id: str | None = None, name: str = "job") -> tuple[AgentGroup, MetricsWatcher]:
    workdir = tmp_path / name
    workdir.mkdir()
    rdzv = Rendezvous("etcd-v3", etcd.endpoint, run_id or unique_run_id(), nnodes, dict(FAST_RDZV_CONF))
    target = [str(WORKER), "--steps", str(steps), "--step-sleep", str(step_sleep),
              "--metrics-file", str(workdir / "metrics.jsonl"), "--progress-file", str(workdir / "progress")]
    group = AgentGroup(workdir, rdzv, target)
    return group, MetricsWatcher(workdir / "metrics.jsonl", group)


def assert_every_step_saw_the_whole_world(watcher: MetricsWatcher) -> list[dict]:
    steps = [event for event in watcher.events() if event["event"] == "step"]
    assert steps, "no step ran"
    assert all(event["sum"] == event["world_size"] for event in steps), steps
    assert [event["step"] for event in steps] == list(range(1, len(steps) + 1)), "a step ran twice or was skipped"
    return steps


@pytest.mark.slow  # the three agents below train to the end too, with the whole world at each step
def test_two_agents_rendezvous_and_train_to_the_end(tmp_path, etcd):
    group, watcher = make_job(tmp_path, etcd, nnodes="2", steps=10, step_sleep=0.05)
    with group:
        group.start()
        group.start()
        start = watcher.wait(is_event("start"), 90, "the first worker group")
        watcher.wait(is_event("done"), 60, "the end of training")
        assert group.wait_all(30) == {"agent0": 0, "agent1": 0}, group.logs()

    assert start["world_size"] == 2
    assert_every_step_saw_the_whole_world(watcher)


def test_three_agents_train_and_a_killed_worker_restarts_the_group_which_resumes(tmp_path, etcd):
    group, watcher = make_job(tmp_path, etcd, nnodes="3", steps=25)
    with group:
        for _ in range(3):
            group.start()
        watcher.wait(is_event("start", world_size=3), 120, "three nodes training")
        before = watcher.wait(is_event("step", step=lambda s: s >= 3), 60, "a few steps")
        group.agents[1].kill_worker()
        restarted = watcher.wait(is_event("start"), 90, "the restarted worker group")
        watcher.wait(is_event("done"), 90, "the end of training")
        assert set(group.wait_all(30).values()) == {0}, group.logs()

    assert restarted["world_size"] == 3
    assert restarted["resume_step"] >= before["step"]
    assert_every_step_saw_the_whole_world(watcher)


# Losing node 0 is the case c10d cannot survive (it hosts the store), so it stays in the fast suite.
@pytest.mark.parametrize(
    "lost", [pytest.param(0, id="first-node"), pytest.param(2, id="last-node", marks=pytest.mark.slow)]
)
def test_the_survivors_of_a_lost_node_re_rendezvous_without_restarting(tmp_path, etcd, lost):
    group, watcher = make_job(tmp_path, etcd, nnodes="1:3", steps=60)
    with group:
        for _ in range(3):
            group.start()
        watcher.wait(is_event("start", world_size=3), 120, "three nodes training")
        before = watcher.wait(is_event("step", step=lambda s: s >= 3), 60, "a few steps")
        survivors = [agent for index, agent in enumerate(group.agents) if index != lost]

        group.agents[lost].kill()  # the whole node: agent and workers
        resumed = watcher.wait(is_event("start", world_size=2), 90, "the survivors' new worker group")
        watcher.wait(is_event("done"), 90, "the end of training")

        assert all(agent.wait(30) == 0 for agent in survivors), group.logs()
    assert resumed["resume_step"] >= before["step"]
    assert_every_step_saw_the_whole_world(watcher)


@pytest.mark.slow
def test_an_etcd_restart_mid_training_does_not_stop_the_job_and_the_next_rendezvous_works(tmp_path, etcd):
    group, watcher = make_job(tmp_path, etcd, nnodes="2", steps=150)
    with group:
        group.start()
        group.start()
        watcher.wait(is_event("start", world_size=2), 120, "two nodes training")
        etcd.stop()
        down_since = time.monotonic()
        watcher.wait(is_event("step"), 30, "training while etcd is down")
        # Longer than the dead-node window (keep_alive_interval x keep_alive_max_attempt = 6 s): missed
        # heartbeats must not make the agents drop each other once etcd is back.
        time.sleep(max(0.0, 10 - (time.monotonic() - down_since)))
        etcd.start()
        watcher.wait(is_event("step"), 30, "training after etcd is back")
        time.sleep(4)  # a spurious restart after the outage would show up as a second start
        assert len([event for event in watcher.events() if event["event"] == "start"]) == 1, group.logs()
        # A worker failure forces a new rendezvous round through the restarted etcd.
        group.agents[0].kill_worker()
        restarted = watcher.wait(is_event("start"), 90, "the worker group of the next round")
        watcher.wait(is_event("done"), 90, "the end of training")
        assert group.wait_all(30) == {"agent0": 0, "agent1": 0}, group.logs()

    assert restarted["world_size"] == 2
    assert_every_step_saw_the_whole_world(watcher)


@pytest.mark.slow
def test_a_run_reusing_the_id_of_a_crashed_run_forms_its_own_world_and_a_finished_run_is_not_rejoined(
        tmp_path, etcd):
    run_id = unique_run_id()
    crashed, crashed_watcher = make_job(tmp_path, etcd, nnodes="1:3", steps=200, run_id=run_id, name="crashed")
    with crashed:
        for _ in range(3):
            crashed.start()
        crashed_watcher.wait(is_event("start", world_size=3), 120, "the first run training")
        for agent in crashed.agents:
            agent.kill()

    # The crashed run left a complete round with three participants behind; the new run must not count them.
    second, watcher = make_job(tmp_path, etcd, nnodes="1:3", steps=10, step_sleep=0.05, run_id=run_id, name="second")
    with second:
        second.start()
        second.start()
        start = watcher.wait(is_event("start"), 120, "the second run's worker group")
        watcher.wait(is_event("done"), 60, "the second run's end")
        assert second.wait_all(30) == {"agent0": 0, "agent1": 0}, second.logs()
    assert start["world_size"] == 2
    assert_every_step_saw_the_whole_world(watcher)

    # The second run finished and closed the rendezvous: a third run with the id is refused, not merged.
    third, third_watcher = make_job(tmp_path, etcd, nnodes="1:3", steps=10, run_id=run_id, name="third")
    with third:
        late = third.start()
        assert late.wait(60) != 0
        assert "RendezvousClosedError" in late.log_tail(20000)
    assert read_events(third_watcher.path) == []

    # delete_rendezvous (what the operator calls) frees the id again.
    assert delete_rendezvous(etcd.endpoint, run_id) >= 1
