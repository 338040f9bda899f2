"""Lose nothing, with real torchrun agents on loopback (CPU, gloo, c10d): a graceful stop of a
node (SIGTERM to its agent's process group, as `ddpjob run` and a kubelet stop one) trains no
step twice; a SIGKILLed worker with the fast snapshot tier trains at most the step in flight
twice. Slow (a restart costs ~10 s here); their in-process twins are test_trainer_graceful_stop.py
and test_fast_snapshot.py.
"""
from __future__ import annotations

import os
import signal

import pytest

from ddpjob_sandbox.metrics import MetricsWatcher, is_event
from ddpjob_sandbox.torchrun import AgentGroup, Rendezvous, example_target
from tests.support.elastic_checks import assert_ran_exactly_once, steps_redone, world_size_phases

EVENT_TIMEOUT = 120


def start_two(group):
    group.start(rdzv_conf_extra={"is_host": True})
    second = group.start(rdzv_conf_extra={"is_host": False})
    watcher = MetricsWatcher(group.workdir / "metrics.jsonl", group)
    watcher.wait(is_event("step", world_size=2, step=lambda s: s >= 5), EVENT_TIMEOUT, "five steps at world size 2")
    return second, watcher


@pytest.mark.slow
def test_a_node_stopped_gracefully_mid_epoch_resumes_at_exactly_the_next_step(tmp_path):
    epochs = 3
    target = example_target(tmp_path, epochs=epochs, samples=512, step_sleep=0.1)
    with AgentGroup(tmp_path, Rendezvous.c10d(), target) as group:
        second, watcher = start_two(group)
        os.killpg(second.pid, signal.SIGTERM)
        stop = watcher.wait(is_event("stop"), EVENT_TIMEOUT, "the graceful stop")
        restart = watcher.wait(is_event("start", resume_step=lambda s: s > 0), EVENT_TIMEOUT, "the restart")
        exit_codes = group.wait_all(timeout=3 * EVENT_TIMEOUT)

    assert exit_codes["agent0"] == 0 and exit_codes["agent1"] != 0, group.logs()
    raw = assert_ran_exactly_once(tmp_path / "metrics.jsonl", epochs)
    assert restart["resume_step"] == stop["step"] and restart["world_size"] == 1
    assert steps_redone(raw) == [], "a graceful stop loses no step"
    assert world_size_phases(raw) == [2, 1]


@pytest.mark.slow
def test_a_killed_worker_with_the_fast_tier_trains_at_most_the_step_in_flight_again(tmp_path):
    epochs = 3
    target = [*example_target(tmp_path, epochs=epochs, samples=512, step_sleep=0.1),
              "--fast-snapshot-every-steps", "1"]
    with AgentGroup(tmp_path, Rendezvous.c10d(), target) as group:
        second, watcher = start_two(group)
        second.kill_worker()
        restart = watcher.wait(is_event("start", resume_step=lambda s: s > 0), EVENT_TIMEOUT, "the restart")
        exit_codes = group.wait_all(timeout=3 * EVENT_TIMEOUT)

    assert exit_codes == {"agent0": 0, "agent1": 0}, group.logs()
    raw = assert_ran_exactly_once(tmp_path / "metrics.jsonl", epochs)
    assert len(steps_redone(raw)) <= 1, f"steps trained twice: {steps_redone(raw)}"
    assert "resumed from the fast tier" in group.logs(20000)
