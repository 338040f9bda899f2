"""The elastic tests' proofs fail when the metrics show a repeated, missing or wrongly resumed step.

Built from small synthetic metrics files, so a check that silently passes
everything would be caught here rather than trusted by the torchrun tests.
"""
from __future__ import annotations

import json

import pytest

from tests.support.elastic_checks import (
    assert_ran_exactly_once,
    assert_resumed_from_snapshots,
    steps_redone,
    world_size_phases,
)
from ddpjob_sandbox.metrics import effective_history


def start(resume_step=0, resume_epoch=0, world_size=2):
    return {"event": "start", "world_size": world_size, "restart_count": 0,
            "resume_epoch": resume_epoch, "resume_step": resume_step}


def steps(epoch, first, last, world_size=2):
    return [{"event": "step", "epoch": epoch, "step": s, "loss": 1.0, "world_size": world_size}
            for s in range(first, last + 1)]


def epoch_end(epoch, step):
    return {"event": "epoch_end", "epoch": epoch, "step": step, "loss": 1.0}


def snapshot(epoch, step):
    return {"event": "snapshot", "epoch": epoch, "step": step, "path": f"s{step}.pt"}


def write(tmp_path, events):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({**e, "time": "2026-01-01T00:00:00.000Z"}) + "\n" for e in events))
    return path


def restarted_job(resume_step=4):
    """Two epochs of 4 steps; killed at step 6, resumed from the snapshot at step 4 with world size 3."""
    return [
        start(), *steps(0, 1, 4), epoch_end(0, 4), snapshot(1, 4), *steps(1, 5, 6),
        start(resume_step, resume_epoch=1, world_size=3), *steps(1, resume_step + 1, 8, world_size=3),
        epoch_end(1, 8), snapshot(2, 8), {"event": "done", "epoch": 1, "step": 8},
    ]


def test_a_restart_from_the_snapshot_passes_every_check(tmp_path):
    raw = assert_ran_exactly_once(write(tmp_path, restarted_job()), epochs=2)
    restarts = assert_resumed_from_snapshots(raw)
    assert [r["resume_step"] for r in restarts] == [4]
    assert steps_redone(raw) == [5, 6]
    assert world_size_phases(raw) == [2, 3]


def test_effective_history_drops_the_steps_after_the_resumed_snapshot():
    history = effective_history(restarted_job(), kinds=("step",))
    assert [e["step"] for e in history] == list(range(1, 9))
    assert [e["world_size"] for e in history][4:] == [3, 3, 3, 3]


def test_a_restart_that_ignores_the_snapshot_is_caught():
    raw = restarted_job()
    raw[raw.index(start(4, 1, 3))] = start(0, 0, 3)
    with pytest.raises(AssertionError, match="must resume at step 4"):
        assert_resumed_from_snapshots(raw)


def test_a_restart_from_a_fast_tier_copy_newer_than_the_snapshot_passes(tmp_path):
    raw = assert_ran_exactly_once(write(tmp_path, restarted_job(resume_step=6)), epochs=2)
    assert [r["resume_step"] for r in assert_resumed_from_snapshots(raw)] == [6]
    assert steps_redone(raw) == []


def test_a_restart_past_every_step_trained_is_caught():
    with pytest.raises(AssertionError, match=r"must resume at step 4, .* or at a newer step trained before it \(at most 6\)"):
        assert_resumed_from_snapshots(restarted_job(resume_step=7))


def test_a_first_step_that_skips_ahead_after_resume_is_caught():
    raw = [e for e in restarted_job() if not (e["event"] == "step" and e["step"] == 5 and e["world_size"] == 3)]
    with pytest.raises(AssertionError, match="expected 5"):
        assert_resumed_from_snapshots(raw)


def test_a_missing_epoch_end_is_caught(tmp_path):
    events = [e for e in restarted_job() if e != epoch_end(1, 8)]
    with pytest.raises(AssertionError, match="must be epochs 0..1"):
        assert_ran_exactly_once(write(tmp_path, events), epochs=2)


def test_a_done_reported_by_a_rolled_back_attempt_is_caught(tmp_path):
    events = restarted_job()
    events.insert(events.index(start(4, 1, 3)), {"event": "done", "epoch": 1, "step": 6})
    with pytest.raises(AssertionError, match="reported done before the final step 8 and was rolled back"):
        assert_ran_exactly_once(write(tmp_path, events), epochs=2)


def test_a_restart_after_the_final_snapshot_may_report_done_again(tmp_path):
    """A worker crashing on its way out makes torchrun restart a finished job: it resumes at the end."""
    events = restarted_job() + [start(8, resume_epoch=2, world_size=3), {"event": "done", "epoch": 1, "step": 8}]
    raw = assert_ran_exactly_once(write(tmp_path, events), epochs=2)
    assert [e["step"] for e in raw if e["event"] == "done"] == [8, 8]


def test_a_step_that_never_ran_is_caught(tmp_path):
    events = [e for e in restarted_job() if not (e["event"] == "step" and e["step"] == 7)]
    with pytest.raises(AssertionError, match="not 1..N each once"):
        assert_ran_exactly_once(write(tmp_path, events), epochs=2)
