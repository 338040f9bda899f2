"""Progress records the contract refuses, and records that say "do not retry" (pure, fixed clock).

A malformed record used to make every reconcile pass raise, freezing the job. Now it is
dropped, the pass goes on, and a Warning Event names the pod and the field, once.
A record with ``fatal`` (the trainer raised DoNotRetry) fails the job at once.
"""
from __future__ import annotations

import json

import pytest
from ddpjob_rdzv.contract import progress_record

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.clock import format_time, parse_time
from ddpjob_operator.decide.actions import CreatePod, Event
from ddpjob_operator.decide.failure import Outcome, classify_pod, diagnose_pod
from ddpjob_operator.decide.observed import RecordProblem, view_pod
from ddpjob_operator.decide.reconcile import reconcile
from tests.operator.builders import at, make_pod, observe
from ddpjob_sandbox.jobs import make_ddpjob

GOOD_TIME = "2026-01-01T11:59:00Z"


def record_text(snapshot=None, resume=None, **extra):
    record = {"kind": C.PROGRESS_RECORD_KIND, "version": 1, "node": "1",
              "snapshot": snapshot or {"epoch": 1, "step": 40, "time": GOOD_TIME, "path": "/s/40.pt"},
              "resume": resume, **extra}
    return json.dumps(record)


BAD_STEP = record_text({"epoch": 1, "step": "12a", "time": GOOD_TIME, "path": "/s/12.pt"})
BAD_TIME = record_text(resume={"time": "yesterday", "firstStepTime": GOOD_TIME})


def failed_with(job, index, message, uid=None):
    pod = make_pod(job, index, phase="Failed", exit_code=1, finished_at=at(10), uid=uid)
    pod["status"]["containerStatuses"][0]["state"]["terminated"]["message"] = message
    return pod


def warnings(result, reason=C.REASON_INVALID_PROGRESS_RECORD):
    return [e.message for e in result.events if e.type == C.EVENT_WARNING and e.reason == reason]


def etcd_job(**fields):
    # etcd: no node hosts the c10d store, so a node failure stays a node failure (no group restart).
    return make_ddpjob(replicas=2, elasticPolicy={"rdzvBackend": "etcd", "rdzvEndpoints": ["etcd:2379"]}, **fields)


@pytest.mark.parametrize(("message", "problem"), [
    (BAD_STEP, 'snapshot.step ("12a") must be an integer from 0 to 9007199254740991'),
    (BAD_TIME, 'resume.time ("yesterday") must be an RFC 3339 time such as 2026-01-02T03:04:05Z'),
])
def test_a_malformed_termination_record_is_dropped_and_the_pass_still_replaces_the_node(message, problem):
    job = etcd_job()
    pods = [make_pod(job, 0), failed_with(job, 1, message)]
    result = reconcile(job, observe(pods), at(20))
    assert result.status["phase"] == C.PHASE_RESTARTING and result.status["restarts"] == 1
    assert result.status["handledFailures"] == ["mlp-node-1-uid"], "the failure is counted"
    assert "lastSnapshot" not in result.status, "nothing from the refused record is taken"
    assert warnings(result) == [f"node pod mlp-node-1: ignored the progress record in its termination message: "
                                f"{problem}"]
    field = problem.split(" ")[0]
    assert result.status["invalidProgressRecords"] == [{"pod": "mlp-node-1", "podUID": "mlp-node-1-uid",
                                                        "field": field, "time": format_time(at(20))}]


def test_a_refused_record_is_reported_once_per_pod_and_field_and_forgotten_with_the_pod():
    job = etcd_job()
    pods = [make_pod(job, 0), failed_with(job, 1, BAD_STEP)]
    first = reconcile(job, observe(pods), at(20))
    job["status"] = first.status
    again = reconcile(job, observe(pods), at(25))
    assert len(warnings(first)) == 1 and warnings(again) == []
    assert again.status["invalidProgressRecords"] == first.status["invalidProgressRecords"]
    other = failed_with(job, 1, BAD_TIME, uid="node-1-second")  # the replacement fails too, another field
    job["status"] = again.status
    third = reconcile(job, observe([make_pod(job, 0), other]), at(200))
    assert warnings(third) == ["node pod mlp-node-1: ignored the progress record in its termination message: "
                               'resume.time ("yesterday") must be an RFC 3339 time such as 2026-01-02T03:04:05Z']
    assert third.status["invalidProgressRecords"] == [{"pod": "mlp-node-1", "podUID": "node-1-second",
                                                       "field": "resume.time", "time": format_time(at(200))}], \
        "the first pod is gone"


def test_a_refused_live_record_is_reported_naming_the_endpoint_and_a_valid_one_is_still_taken():
    job = etcd_job()
    pods = [make_pod(job, 0), make_pod(job, 1)]
    invalid = progress_record.parse(BAD_STEP)
    live = [RecordProblem.of(view_pod(pods[0]), C.SOURCE_PROGRESS_ENDPOINT, invalid), json.loads(record_text())]
    result = reconcile(job, observe(pods, live_progress=live), at(20))
    assert result.status["phase"] == C.PHASE_RUNNING
    assert result.status["lastSnapshot"] == {"epoch": 1, "step": 40, "time": GOOD_TIME, "path": "/s/40.pt"}
    assert warnings(result) == ["node pod mlp-node-0: ignored the progress record in its progress endpoint: "
                                'snapshot.step ("12a") must be an integer from 0 to 9007199254740991']


def test_valid_and_refused_records_of_one_pod_are_told_apart():
    job = etcd_job()
    pod = failed_with(job, 1, record_text())
    pod["status"]["containerStatuses"][0]["lastState"] = {"terminated": {"exitCode": 1, "message": BAD_STEP}}
    view = view_pod(pod)
    assert [r["snapshot"]["step"] for r in view.progress] == [40]
    assert [(view.name, p.field) for p in view.record_problems] == [("mlp-node-1", "snapshot.step")]


def test_a_refused_record_is_not_shown_raw_as_the_failure_message():
    job = etcd_job()
    diagnosis = diagnose_pod(view_pod(failed_with(job, 1, BAD_STEP)))
    assert (diagnosis.outcome, diagnosis.message) == (Outcome.RETRYABLE, "")


# --- fatal: the trainer raised DoNotRetry ------------------------------------------------------

FATAL = record_text(error="BadDataset: shard 3: checksum mismatch",
                    fatal={"reason": "BadDataset", "message": "shard 3: checksum mismatch"})


def test_a_fatal_record_fails_the_job_at_once_with_its_reason_and_message():
    job = etcd_job(failurePolicy={"maxRestarts": 10})
    result = reconcile(job, observe([make_pod(job, 0), failed_with(job, 1, FATAL)]), at(20))
    assert result.status["phase"] == C.PHASE_FAILED and result.status["restarts"] == 0
    failed = next(c for c in result.status["conditions"] if c["type"] == "Failed")
    message = ("node pod mlp-node-1 failed (exit code 1): shard 3: checksum mismatch; its trainer raised "
               "DoNotRetry (BadDataset): not retried")
    assert (failed["status"], failed["reason"], failed["message"]) == ("True", "BadDataset", message)
    assert Event(C.EVENT_WARNING, "BadDataset", message) in result.events
    assert not any(isinstance(a, CreatePod) for a in result.actions), "no replacement"
    (entry,) = result.status["failures"]
    assert (entry["cause"], entry["reason"], entry["message"]) == (C.CAUSE_DO_NOT_RETRY, "BadDataset",
                                                                   "shard 3: checksum mismatch")


@pytest.mark.parametrize(("phase", "message", "outcome"), [
    ("Failed", FATAL, Outcome.PERMANENT),
    ("Failed", record_text(), Outcome.RETRYABLE),
    ("Succeeded", FATAL, Outcome.SUCCEEDED),  # a later worker of the container finished training
    ("Failed", record_text(fatal={"reason": "bad reason", "message": "m"}), Outcome.RETRYABLE),  # refused
])
def test_only_a_valid_fatal_record_of_a_failed_pod_is_permanent(phase, message, outcome):
    job = etcd_job()
    pod = make_pod(job, 1, phase=phase)
    pod["status"]["containerStatuses"][0]["state"]["terminated"]["message"] = message
    assert classify_pod(view_pod(pod)) == outcome


def test_a_fatal_record_wins_over_a_disruption():
    job = etcd_job()
    pod = failed_with(job, 1, FATAL)
    pod["status"]["conditions"].append({"type": "DisruptionTarget", "status": "True",
                                        "reason": "EvictionByEvictionAPI"})
    diagnosis = diagnose_pod(view_pod(pod))
    assert (diagnosis.outcome, diagnosis.reason) == (Outcome.PERMANENT, "BadDataset")


def test_every_time_the_contract_accepts_the_operator_can_read():
    for moment in ("2026-11-23T01:02:03Z", "2026-11-23T01:02:03.1+05:30", "2026-11-23T01:02:03.123456789-08:00"):
        assert isinstance(progress_record.parse(record_text(written=moment)), progress_record.Record)
        assert parse_time(moment).tzinfo is not None


def test_a_fatal_record_is_reported_by_one_event():
    job = etcd_job(failurePolicy={"maxRestarts": 10})
    result = reconcile(job, observe([make_pod(job, 0), failed_with(job, 1, FATAL)]), at(20))
    assert [e.reason for e in result.events].count("BadDataset") == 1
