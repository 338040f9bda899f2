"""A node SIGKILLed mid-training: the survivor's agent hears it from the lost node's liveness
beacon and stops its workers at once (ddpjob_trainer.rendezvous.notice), and training goes on
exactly (every step once, at most the step in flight again with the fast tier). A node stopped
gracefully, or a job that simply finishes, is never taken for a loss. Real torchrun agents on
loopback with ``--rdzv_backend=ddpjob-c10d`` (CPU, gloo). How fast, on a calm machine:
``python -m bench recovery`` (the "notice" part).
"""
from __future__ import annotations

import os
import signal
import time

import pytest

from ddpjob_sandbox.metrics import MetricsWatcher, is_event
from ddpjob_sandbox.procs import free_port
from ddpjob_sandbox.torchrun import FAST_RDZV_CONF, AgentGroup, Rendezvous, example_target, unique_run_id
from tests.support.elastic_checks import assert_ran_exactly_once, steps_redone, world_size_phases

EVENT_TIMEOUT = 120
NOTICE = "beacon closed"  # the cause the survivor's agent logs (watch.LOST)
# A bound on kill -> the survivor's workers gone that only a missed notice exceeds (without it,
# the workers wait for gloo's timeout): the figure itself is the bench's.
STOPPED_WITHIN = 30.0


def ddpjob_c10d() -> Rendezvous:
    return Rendezvous("ddpjob-c10d", f"127.0.0.1:{free_port()}", unique_run_id(), "1:3", dict(FAST_RDZV_CONF))


def start_two(group: AgentGroup):
    group.start(rdzv_conf_extra={"is_host": True})
    second = group.start(rdzv_conf_extra={"is_host": False})
    watcher = MetricsWatcher(group.workdir / "metrics.jsonl", group)
    watcher.wait(is_event("step", world_size=2, step=lambda s: s >= 5), EVENT_TIMEOUT, "five steps at world size 2")
    return group.agents[0], second, watcher


def wait_gone(agent, pids: set[int], since: float, timeout: float) -> float:
    """Seconds from ``since`` until none of ``pids`` is a live worker of ``agent`` (fails after ``timeout``)."""
    while pids & set(agent.workers()):
        assert time.monotonic() - since < timeout, f"the survivor's workers {pids} still run:\n{agent.log_tail()}"
        time.sleep(0.02)
    return time.monotonic() - since


def test_a_killed_node_is_noticed_from_its_beacon_and_the_survivor_resumes_exactly(tmp_path):
    epochs = 3
    target = [*example_target(tmp_path, epochs=epochs, samples=512, step_sleep=0.1),
              "--fast-snapshot-every-steps", "1"]
    with AgentGroup(tmp_path, ddpjob_c10d(), target) as group:
        survivor, second, watcher = start_two(group)
        workers = set(survivor.wait_for_workers())
        killed = time.monotonic()
        second.kill()
        stopped_after = wait_gone(survivor, workers, killed, STOPPED_WITHIN)
        watcher.wait(is_event("start", resume_step=lambda s: s > 0), EVENT_TIMEOUT, "the restart")
        exit_codes = group.wait_all(timeout=3 * EVENT_TIMEOUT)

    log = survivor.log_tail(200_000)
    assert exit_codes["agent0"] == 0, group.logs()
    assert NOTICE in log and "stopped this node's workers" in log, log[-5000:]
    print(f"kill -> survivor's workers gone: {stopped_after:.2f} s")
    raw = assert_ran_exactly_once(tmp_path / "metrics.jsonl", epochs)
    assert len(steps_redone(raw)) <= 1, f"steps trained twice: {steps_redone(raw)}"
    assert world_size_phases(raw) == [2, 1]


@pytest.mark.slow  # its mechanism (LEAVING at interpreter exit) is in tests/rendezvous/test_beacon_watch.py
def test_a_node_stopped_gracefully_is_not_taken_for_a_lost_one(tmp_path):
    """SIGTERM to the node's process group (ddpjob run's stop, a kubelet's): its agent says
    LEAVING as it exits, the survivor restarts on its workers' PeerStopped and loses no step."""
    epochs = 3
    target = example_target(tmp_path, epochs=epochs, samples=512, step_sleep=0.1)
    with AgentGroup(tmp_path, ddpjob_c10d(), target) as group:
        survivor, second, watcher = start_two(group)
        os.killpg(second.pid, signal.SIGTERM)
        stop = watcher.wait(is_event("stop"), EVENT_TIMEOUT, "the graceful stop")
        restart = watcher.wait(is_event("start", resume_step=lambda s: s > 0), EVENT_TIMEOUT, "the restart")
        exit_codes = group.wait_all(timeout=3 * EVENT_TIMEOUT)

    assert exit_codes["agent0"] == 0, group.logs()
    assert NOTICE not in survivor.log_tail(200_000), survivor.log_tail()
    raw = assert_ran_exactly_once(tmp_path / "metrics.jsonl", epochs)
    assert restart["resume_step"] == stop["step"] and steps_redone(raw) == []


def test_nodes_that_finish_together_take_no_one_for_lost(tmp_path):
    target = example_target(tmp_path, epochs=1, samples=256, step_sleep=0.05)
    with AgentGroup(tmp_path, ddpjob_c10d(), target) as group:
        group.start(rdzv_conf_extra={"is_host": True})
        group.start(rdzv_conf_extra={"is_host": False})
        exit_codes = group.wait_all(timeout=3 * EVENT_TIMEOUT)

    assert exit_codes == {"agent0": 0, "agent1": 0}, group.logs()
    assert all(NOTICE not in agent.log_tail(200_000) for agent in group.agents), group.logs()
    raw = assert_ran_exactly_once(tmp_path / "metrics.jsonl", 1)
    assert world_size_phases(raw) == [2]
