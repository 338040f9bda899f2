"""A training job's status is written on news at once and on routine progress at most once per
interval (decide/writes.py), while the hang clock runs on every poll from the status the
operator keeps: the controller's loop replayed here with plain data and a fixed clock."""
from __future__ import annotations

import pytest

from ddpjob_operator.api import constants as C
from ddpjob_operator.decide.reconcile import reconcile
from ddpjob_operator.decide.writes import routine_only, write_due
from tests.operator.builders import at, observe
from tests.operator.decide.test_hang import job, record, running

RUNNING = {"phase": C.PHASE_RUNNING, "restarts": 0,
           "progress": {"step": 40, "stepSeconds": 0.5, "advancedTime": "2026-01-01T12:00:00Z",
                        "hangTimeoutSeconds": 300.0, "slowestNode": "1", "slowdown": 1.1},
           "lastSnapshot": {"epoch": 0, "step": 40, "time": "2026-01-01T12:00:00Z", "path": "/s/40.pt"}}


def changed(**fields):
    status = {**RUNNING, **{k: v for k, v in fields.items() if k != "progress"}}
    return {**status, "progress": {**RUNNING["progress"], **fields.get("progress", {})}}


@pytest.mark.parametrize("computed", [
    changed(progress={"step": 41, "advancedTime": "2026-01-01T12:00:30Z"}),
    changed(progress={"stepSeconds": 0.6, "hangTimeoutSeconds": 300.0, "slowdown": 1.3, "slowSince": "x"}),
    changed(lastSnapshot={"epoch": 0, "step": 80, "time": "2026-01-01T12:01:00Z", "path": "/s/80.pt"}),
], ids=["step", "step-figures", "snapshot"])
def test_routine_progress_waits_for_the_interval(computed):
    assert routine_only(RUNNING, computed)
    assert not write_due(RUNNING, computed, since_write=599.0, interval=600.0)
    assert write_due(RUNNING, computed, since_write=600.0, interval=600.0)
    assert write_due(RUNNING, computed, since_write=1.0, interval=0.0), "0 writes every change, as before"


@pytest.mark.parametrize("computed", [
    changed(phase=C.PHASE_RESTARTING),
    changed(restarts=1),
    changed(failures=[{"cause": C.CAUSE_HANG}]),
    changed(progress={"reportedStraggler": "1"}),
    changed(progress={"run": "2026-01-01T12:05:00Z"}),
    changed(conditions=[{"type": "Running", "status": "True"}]),
], ids=["phase", "restarts", "failure", "straggler", "new-run", "condition"])
def test_news_is_written_at_once(computed):
    assert not routine_only(RUNNING, computed)
    assert write_due(RUNNING, computed, since_write=0.0, interval=600.0)


def test_nothing_new_is_never_written():
    assert not write_due(RUNNING, dict(RUNNING), since_write=10_000.0, interval=0.0)
    assert not write_due({}, {}, since_write=10_000.0, interval=600.0)


def train(body, seconds, steps, interval):
    """The controller's loop (job_pass.py) over a job polled every 30 s: each pass computes from
    the kept status, writes it when due; returns the stored status and the write times."""
    kept, written_at, writes, found = body["status"], 0.0, [], None
    for t in range(30, seconds + 1, 30):
        step = steps(t)
        result = reconcile({**body, "status": kept}, observe(running(body), live_progress=[record(step)]), at(t))
        if write_due(body["status"], result.status, t - written_at, interval):
            body["status"], written_at = result.status, t
            writes.append(t)
        kept = result.status
        if found is None and kept["phase"] == C.PHASE_RESTARTING:
            found = t
    return writes, found


def test_an_hour_of_steady_training_writes_every_interval_and_a_hang_is_found_as_soon_as_before():
    def steps(t):
        return t // 10 if t <= 3000 else 300  # training moves, then stands still from t=3000

    outcomes = {}
    for interval in (0.0, 600.0):
        body = job(hangTimeoutSeconds=120)
        body["status"] = reconcile(body, observe(running(body), live_progress=[record(0)]), at(0)).status
        outcomes[interval] = train(body, 3600, steps, interval)
    (every, hang_every), (bounded, hang_bounded) = outcomes[0.0], outcomes[600.0]
    assert len(every) >= 100, "before: a write at every poll where the step moved"
    assert hang_bounded == hang_every == 3120, "the hang clock ran on the kept status: found on the same poll"
    assert hang_bounded in bounded, "the hang restart is written at once"
    assert [t for t in bounded if t < 3000] == [600, 1200, 1800, 2400], "routine progress: once per interval"
