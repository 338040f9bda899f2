"""Failure diagnosis (cause, reason, message), progress records and the budget by progress (pure)."""

from __future__ import annotations

import json

import pytest

from ddpjob_operator.api import constants as C
from ddpjob_operator.decide.failure import Outcome, classify_pod, diagnose_deleted, diagnose_pod, image_pull_stuck
from ddpjob_operator.decide.budget import newer_snapshot
from ddpjob_operator.decide.observed import view_pod
from ddpjob_operator.decide.budget import RestartBudget, account_incidents, backoff_exponent, budget_limit_passed
from tests.operator.builders import T0, at, make_pod
from ddpjob_sandbox.jobs import make_ddpjob

JOB = make_ddpjob(replicas=2)


def record(step=None, error=None, time="2026-01-01T11:59:00Z"):
    rec = {"kind": C.PROGRESS_RECORD_KIND, "version": 1, "node": "1",
           "snapshot": None if step is None else {"epoch": 1, "step": step, "time": time, "path": f"/s/{step}.pt"},
           "resume": {"time": "2026-01-01T11:00:00.000Z", "fromStep": None, "fromSnapshotTime": None,
                      "firstStepTime": "2026-01-01T11:00:05.000Z"}}
    if error:
        rec["error"] = error
    return json.dumps(rec) + " " * 200  # padded, as the trainer writes it


def failed(reason=None, code=1, message=None, condition=None, pod_reason=None):
    pod = make_pod(JOB, 1, phase="Failed", exit_code=code, reason=reason)
    if message is not None:
        pod["status"]["containerStatuses"][0]["state"]["terminated"]["message"] = message
    if condition is not None:
        pod["status"]["conditions"].append({"type": "DisruptionTarget", "status": "True", **condition})
    if pod_reason is not None:
        pod["status"]["reason"] = pod_reason
    return pod


DIAGNOSES = [
    # pod, outcome, cause, reason, message
    (failed(code=1, message=record(12, error="RuntimeError: CUDA error")), Outcome.RETRYABLE, C.CAUSE_ERROR,
     "", "RuntimeError: CUDA error"),
    (failed(code=137, reason="OOMKilled"), Outcome.RETRYABLE, C.CAUSE_OOM, "OOMKilled", ""),
    (failed(code=127, message="torchrun: not found\n"), Outcome.PERMANENT, C.CAUSE_PERMANENT, "",
     C.MSG_LOG_TAIL_HIDDEN),  # a log tail (no progress record): not copied unless includeLogTail
    (failed(code=143, condition={"reason": "PreemptionByScheduler", "message": "preempted by prio-high"}),
     Outcome.DISRUPTION, C.CAUSE_DISRUPTED, "PreemptionByScheduler", "preempted by prio-high"),
    (failed(code=143, condition={"reason": "EvictionByEvictionAPI"}), Outcome.DISRUPTION, C.CAUSE_DISRUPTED,
     "EvictionByEvictionAPI", ""),
    (failed(code=143, condition={"reason": "DeletionByTaintManager", "message": "node unreachable"}),
     Outcome.DISRUPTION, C.CAUSE_NODE_LOST, "DeletionByTaintManager", "node unreachable"),
    (failed(code=None, reason="Evicted"), Outcome.DISRUPTION, C.CAUSE_DISRUPTED, "Evicted", ""),
    (failed(code=None, pod_reason="NodeLost"), Outcome.DISRUPTION, C.CAUSE_NODE_LOST, "NodeLost", ""),
]


@pytest.mark.parametrize("pod,outcome,cause,reason,message", DIAGNOSES)
def test_a_failed_pod_is_diagnosed_with_cause_reason_and_message(pod, outcome, cause, reason, message):
    diagnosis = diagnose_pod(view_pod(pod), permanent_exit_codes=(126, 127))
    assert (diagnosis.outcome, diagnosis.cause, diagnosis.reason, diagnosis.message) == (outcome, cause, reason, message)
    assert classify_pod(view_pod(pod), (126, 127)) == outcome


def test_running_and_succeeded_pods_have_no_diagnosis():
    assert diagnose_pod(view_pod(make_pod(JOB, 0))) is None
    assert diagnose_pod(view_pod(make_pod(JOB, 0, phase="Succeeded"))) is None


def test_a_long_log_tail_keeps_its_end_when_log_tails_are_included():
    diagnosis = diagnose_pod(view_pod(failed(message="x" * 1000 + " the real error")), include_log_tail=True)
    assert len(diagnosis.message) == 300 and diagnosis.message.endswith("the real error")


@pytest.mark.parametrize("include, message", [(False, C.MSG_LOG_TAIL_HIDDEN), (True, "torchrun: not found")])
def test_a_log_tail_is_copied_only_when_included_and_a_progress_records_error_always(include, message):
    tail = view_pod(failed(code=127, message="torchrun: not found\n"))
    assert diagnose_pod(tail, include_log_tail=include).message == message
    with_record = view_pod(failed(code=1, message=record(12, error="RuntimeError: CUDA error")))
    assert diagnose_pod(with_record, include_log_tail=include).message == "RuntimeError: CUDA error"


def test_a_pod_deleted_under_disruption_target_is_a_disruption_even_while_running():
    pod = make_pod(JOB, 1, deleting=True)
    pod["status"]["conditions"].append({"type": "DisruptionTarget", "status": "True",
                                        "reason": "DeletionByTaintManager", "message": "taint node.kubernetes.io/unreachable"})
    diagnosis = diagnose_deleted(view_pod(pod))
    assert (diagnosis.outcome, diagnosis.cause) == (Outcome.DISRUPTION, C.CAUSE_NODE_LOST)
    assert diagnose_deleted(view_pod(make_pod(JOB, 1, deleting=True))) is None  # an ordinary deletion (scale down)


def waiting(reason, created):
    pod = make_pod(JOB, 1, phase="Pending", created_at=created)
    pod["status"]["containerStatuses"] = [{"name": C.CONTAINER_NAME, "state": {"waiting": {
        "reason": reason, "message": "pull access denied"}}}]
    return pod


@pytest.mark.parametrize("reason,age,stuck", [
    ("ImagePullBackOff", 299, False), ("ImagePullBackOff", 300, True), ("ErrImagePull", 400, True),
    ("InvalidImageName", 0, True), ("ContainerCreating", 10_000, False)])
def test_image_pull_errors_fail_after_the_timeout_and_invalid_names_at_once(reason, age, stuck):
    assert image_pull_stuck(view_pod(waiting(reason, at(-age))), T0, 300) is stuck


def test_only_our_records_are_read_from_termination_messages():
    assert [r["snapshot"]["step"] for r in view_pod(failed(message=record(7))).progress] == [7]
    for message in ("Traceback ...\nValueError", '{"kind": "other"}', None):
        view = view_pod(failed(message=message))
        assert (view.progress, view.record, view.termination_holds_record) == ((), {}, False)


def test_records_come_from_the_current_and_the_last_termination():
    pod = failed(message=record(9))
    pod["status"]["containerStatuses"][0]["lastState"] = {"terminated": {"message": record(4)}}
    assert [r["snapshot"]["step"] for r in view_pod(pod).progress] == [9, 4]


@pytest.mark.parametrize("candidate,current,newer", [
    ({"step": 5, "time": "2026-01-01T12:00:00Z"}, None, True),
    ({"step": 5, "time": "2026-01-01T12:00:00Z"}, {"step": 5, "time": "2026-01-01T12:00:00Z"}, False),
    ({"step": 6, "time": "2026-01-01T12:00:00Z"}, {"step": 5, "time": "2026-01-01T12:00:00Z"}, True),
    ({"step": 2, "time": "2026-01-01T13:00:00Z"}, {"step": 5, "time": "2026-01-01T12:00:00Z"}, True),  # a wiped volume
    ({"step": 9, "time": "2026-01-01T11:00:00Z"}, {"step": 5, "time": "2026-01-01T12:00:00Z"}, False),
    (None, {"step": 5, "time": "2026-01-01T12:00:00Z"}, False),
])
def test_snapshots_are_ordered_by_completion_time_then_step(candidate, current, newer):
    assert newer_snapshot(candidate, current) is newer


@pytest.mark.parametrize("before,new,progressed,after", [
    (RestartBudget(1, 0, 0), 1, True, RestartBudget(1, 1, 0)),
    (RestartBudget(2, 1, 0), 1, False, RestartBudget(2, 1, 1)),
    (RestartBudget(3, 1, 1), 1, False, RestartBudget(3, 1, 2)),
    (RestartBudget(4, 1, 2), 1, True, RestartBudget(4, 2, 0)),   # progress ends the streak
    (RestartBudget(2, 0, 0), 2, True, RestartBudget(2, 1, 1)),   # two at once: only the first is free
    (RestartBudget(3, 0, 1), 1, None, RestartBudget(3, 0, 1)),   # progress unknown: charged, streak unjudged
    (RestartBudget(3, 0, 1), 0, False, RestartBudget(3, 0, 1)),
])
def test_incidents_after_progress_are_free_and_the_streak_counts_the_others(before, new, progressed, after):
    assert account_incidents(before, new, progressed) == after


@pytest.mark.parametrize("budget,max_restarts,max_streak,limit", [
    (RestartBudget(9, 8, 0), 2, 3, None),                       # progress each time: 1 charged
    (RestartBudget(9, 6, 0), 2, 3, "maxRestarts"),              # 3 charged > 2
    (RestartBudget(4, 0, 4), 10, 3, "maxRestartsWithoutProgress"),
    (RestartBudget(4, 0, 4), 2, 3, "maxRestartsWithoutProgress"),  # the crash loop is the better reason
    (RestartBudget(4, 0, 4), 10, None, None),                   # streak limit off
    (RestartBudget(3, 0, 3), 3, 3, None),
])
def test_the_budget_limit_passed_names_the_field(budget, max_restarts, max_streak, limit):
    assert budget_limit_passed(budget, max_restarts, max_streak) == limit


@pytest.mark.parametrize("budget,known,nth", [
    (RestartBudget(0, 0, 0), True, 0),
    (RestartBudget(5, 5, 0), True, 0),  # after progress: at once
    (RestartBudget(5, 4, 1), True, 1),  # the first incident in a row without progress: the first delay
    (RestartBudget(5, 2, 3), True, 3),
    (RestartBudget(1, 0, 0), False, 0),  # no progress reports: the first charged incident at once
    (RestartBudget(3, 0, 0), False, 2), (RestartBudget(3, 2, 0), False, 0)])
def test_backoff_is_none_after_progress_and_doubles_in_a_crash_loop(budget, known, nth):
    assert backoff_exponent(budget, known) == nth
