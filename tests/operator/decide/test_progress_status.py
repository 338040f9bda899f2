"""Status from the trainer's progress records: lastSnapshot, the budget by progress,
status.failures, image pull failures and the recovery figures (pure, fixed clock)."""

from __future__ import annotations

import json

import pytest

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.clock import format_time
from ddpjob_operator.decide.actions import Requeue
from ddpjob_operator.decide.reconcile import reconcile
from ddpjob_operator.api.validation import parse_spec
from ddpjob_operator.decide.budget import replacement_delay
from tests.operator.builders import at, make_pod, observe, running_pods
from ddpjob_sandbox.jobs import make_ddpjob
from tests.operator.decide.test_status import step


def snap(step_, seconds, epoch=0):
    return {"epoch": epoch, "step": step_, "time": format_time(at(seconds)), "path": f"/snapshots/s{step_}.pt",
            "samples_consumed": 0}


def with_record(pod, snapshot=None, resume=None, error=None):
    """The pod's terminated container carries the trainer's progress record."""
    rec = {"kind": C.PROGRESS_RECORD_KIND, "version": 1, "node": "1", "snapshot": snapshot,
           "resume": resume or {"time": None, "fromStep": None, "fromSnapshotTime": None, "firstStepTime": None}}
    if error:
        rec["error"] = error
    pod["status"]["containerStatuses"][0]["state"]["terminated"]["message"] = json.dumps(rec)
    return pod


def resume(start, first_step, from_snapshot=None):
    return {"time": format_time(at(start)), "firstStepTime": format_time(at(first_step)),
            "fromStep": from_snapshot["step"] if from_snapshot else None,
            "fromSnapshotTime": from_snapshot["time"] if from_snapshot else None}


def fail_node_1(job, seconds, snapshot, n, **record):
    """Node 1 (a replacement created after the previous incident) fails at T0+seconds."""
    pod = make_pod(job, 1, phase="Failed", exit_code=1, finished_at=at(seconds), uid=f"node-1-{n}",
                   created_at=at(seconds - 5))
    return step(job, [make_pod(job, 0), with_record(pod, snapshot, **record)], seconds + 1)


def etcd_job(**fields):
    # etcd: node 0 hosts no store, so node failures stay ordinary (no whole-group restart).
    return make_ddpjob(replicas=2, elasticPolicy={"rdzvBackend": "etcd", "rdzvEndpoints": ["etcd:2379"]}, **fields)


def test_the_newest_reported_snapshot_reaches_last_snapshot_and_an_older_one_does_not_replace_it():
    job = etcd_job()
    step(job, running_pods(job), 0)
    update = fail_node_1(job, 100, snap(40, 90, epoch=2), 1)
    assert update.status["lastSnapshot"] == {"epoch": 2, "step": 40, "time": "2026-01-01T12:01:30Z",
                                             "path": "/snapshots/s40.pt"}
    older = fail_node_1(job, 300, snap(20, 50), 2)
    assert older.status["lastSnapshot"]["step"] == 40


def test_a_crash_loop_at_the_same_step_fails_with_no_progress_naming_step_and_count():
    job = etcd_job(failurePolicy={"maxRestarts": 10, "maxRestartsWithoutProgress": 2})
    step(job, running_pods(job), 0)
    stuck = snap(120, 50, epoch=3)
    first = fail_node_1(job, 100, stuck, 1, error="RuntimeError: NaN loss")
    assert (first.status["restarts"], first.status["restartsWithProgress"], first.status["restartsWithoutProgress"]) == (1, 1, 0)
    assert "not charged: a newer snapshot (step 120) was complete" in first.events[0].message
    for n, seconds in ((2, 300), (3, 500)):
        update = fail_node_1(job, seconds, stuck, n, error="RuntimeError: NaN loss")
        assert update.status["phase"] == "Restarting" and update.status["restartsWithoutProgress"] == n - 1
    final = fail_node_1(job, 700, stuck, 4, error="RuntimeError: NaN loss")
    assert final.status["phase"] == "Failed" and final.status["restartsWithoutProgress"] == 3
    failed = next(c for c in final.status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "NoProgress"
    assert failed["message"] == (
        "3 failure incidents in a row without a newer snapshot (still at step 120, epoch 3) exceed "
        "spec.failurePolicy.maxRestartsWithoutProgress (2); last: node pod mlp-node-1 (exit code 1): "
        "RuntimeError: NaN loss")
    assert ("Warning", "NoProgress") in [(e.type, e.reason) for e in final.events]


def test_a_job_making_progress_survives_more_failures_than_max_restarts():
    job = etcd_job(failurePolicy={"maxRestarts": 1})
    step(job, running_pods(job), 0)
    for n in range(1, 6):
        update = fail_node_1(job, 200 * n, snap(10 * n, 200 * n - 20), n)
        assert update.status["phase"] == "Restarting", update.status["conditions"]
    assert (update.status["restarts"], update.status["restartsWithProgress"]) == (5, 5)


def test_max_restarts_counts_only_incidents_without_progress():
    job = etcd_job(failurePolicy={"maxRestarts": 1, "maxRestartsWithoutProgress": None})
    step(job, running_pods(job), 0)
    fail_node_1(job, 100, snap(10, 90), 1)              # progress: free
    fail_node_1(job, 300, snap(10, 90), 2)              # charged 1 of 1
    final = fail_node_1(job, 500, snap(10, 90), 3)      # charged 2 > 1
    failed = next(c for c in final.status["conditions"] if c["type"] == "Failed")
    assert (failed["reason"], failed["message"]) == ("RestartBudgetExhausted", (
        "2 failure incidents exceed spec.failurePolicy.maxRestarts (1); 1 more after a newer snapshot were not charged"))


def test_without_progress_reports_the_old_budget_applies_unchanged():
    job = etcd_job(failurePolicy={"maxRestarts": 2, "maxRestartsWithoutProgress": 0})
    step(job, running_pods(job), 0)
    phases = [fail_node_1(job, 200 * n, None, n).status["phase"] for n in (1, 2, 3)]
    assert phases == ["Restarting", "Restarting", "Failed"]
    assert "restartsWithoutProgress" not in job["status"]


def test_a_disruption_target_does_not_use_the_budget_and_is_listed_with_its_reason():
    job = etcd_job(failurePolicy={"maxRestarts": 0})
    step(job, running_pods(job), 0)
    pod = make_pod(job, 1, phase="Failed", exit_code=143, finished_at=at(10))
    pod["status"]["conditions"].append({"type": "DisruptionTarget", "status": "True",
                                        "reason": "PreemptionByScheduler", "message": "preempted by team-a/big"})
    update = step(job, [make_pod(job, 0), pod], 11)
    assert update.status["phase"] == "Restarting" and update.status["restarts"] == 0
    assert update.status["failures"] == [{
        "index": 1, "pod": "mlp-node-1", "podUID": "mlp-node-1-uid", "cause": "Disrupted", "exitCode": 143,
        "reason": "PreemptionByScheduler", "message": "preempted by team-a/big", "time": "2026-01-01T12:00:10Z"}]


def test_failures_are_listed_once_with_cause_and_the_trainers_error_and_capped():
    job = etcd_job(failurePolicy={"maxRestarts": 100, "maxRestartsWithoutProgress": None, "backoffSeconds": 0})
    step(job, running_pods(job), 0)
    oom = make_pod(job, 1, phase="Failed", exit_code=137, reason="OOMKilled", finished_at=at(5), uid="oom")
    update = step(job, [make_pod(job, 0), with_record(oom, error="killed")], 6)
    step(job, [make_pod(job, 0), oom], 7)
    assert [(f["cause"], f["exitCode"], f["reason"], f["message"]) for f in update.status["failures"]] == [
        ("OOMKilled", 137, "OOMKilled", "killed")]
    for n in range(12):
        fail_node_1(job, 100 * (n + 1), None, n)
    assert len(job["status"]["failures"]) == C.MAX_FAILURES_KEPT
    assert job["status"]["failures"][-1]["podUID"] == "node-1-11"


def test_a_pod_deleted_because_its_node_was_lost_is_listed_without_using_the_budget():
    job = etcd_job()
    step(job, running_pods(job), 0)
    lost = make_pod(job, 1, deleting=True)
    lost["status"]["conditions"].append({"type": "DisruptionTarget", "status": "True",
                                         "reason": "DeletionByTaintManager", "message": "node unreachable"})
    update = step(job, [make_pod(job, 0), lost], 5)
    assert update.status["restarts"] == 0
    assert update.status["failures"][0]["cause"] == "NodeLost"
    assert [e.reason for e in update.events].count("NodeDisrupted") == 1
    assert "NodeDisrupted" not in [e.reason for e in step(job, [make_pod(job, 0), lost], 6).events]


@pytest.mark.parametrize("reason,age,phase", [("ImagePullBackOff", 100, "Pending"),
                                              ("ImagePullBackOff", 301, "Failed"),
                                              ("InvalidImageName", 1, "Failed")])
def test_an_image_that_cannot_be_pulled_fails_the_job_with_a_clear_reason(reason, age, phase):
    job = etcd_job()
    step(job, [], 0)
    pods = [make_pod(job, i, phase="Pending", created_at=at(0)) for i in (0, 1)]
    for pod in pods:
        pod["status"]["containerStatuses"] = [{"name": C.CONTAINER_NAME, "state": {"waiting": {
            "reason": reason, "message": "manifest unknown"}}}]
    update = step(job, pods, age)
    assert update.status["phase"] == phase
    if phase == "Failed":
        failed = next(c for c in update.status["conditions"] if c["type"] == "Failed")
        rule = ("the image name can never be pulled: fix spec.image" if reason == "InvalidImageName" else
                "still failing spec.failurePolicy.imagePullTimeoutSeconds (300s) after the pod was created")
        assert (failed["reason"], failed["message"]) == ("ImagePullFailed", (
            f"node pod mlp-node-0 cannot pull image ghcr.io/ddpjob/trainer:0.1.0 ({reason}: manifest unknown); {rule}"))
        assert [(f["pod"], f["cause"], f["reason"], f["message"]) for f in update.status["failures"]] == [
            ("mlp-node-0", "ImagePull", reason, "manifest unknown")]


def test_time_to_recover_and_lost_time_come_from_the_next_record():
    job = etcd_job()
    step(job, running_pods(job), 0)
    s1 = snap(50, 80)
    # Run 1 started at T0+2, first step at T0+12 (lead 12 s from the job's start), failed at 100.
    fail_node_1(job, 100, s1, 1, resume=resume(2, 12))
    recovery = job["status"]["recovery"]
    # The first run's lead is start-up, not time lost to a failure.
    assert recovery["startupSeconds"] == 12.0 and "lostSeconds" not in recovery and "lastRecoverySeconds" not in recovery
    # Run 2 resumed from s1: started at 120, first step at 130. Seen when the job succeeds.
    done = [with_record(make_pod(job, i, phase="Succeeded", finished_at=at(400)), snap(90, 390),
                        resume=resume(120, 130, s1)) for i in (0, 1)]
    update = step(job, done, 401)
    recovery = update.status["recovery"]
    assert update.status["phase"] == "Succeeded"
    assert recovery["lastRecoverySeconds"] == 30.0  # failure at 100 -> first resumed step at 130
    assert recovery["lostSeconds"] == 50.0 and recovery["startupSeconds"] == 12.0  # snapshot at 80 -> first step at 130
    assert recovery["lastResume"] == {"time": "2026-01-01T12:02:00Z", "firstStepTime": "2026-01-01T12:02:10Z",
                                      "fromStep": 50}
    assert step(job, done, 402).status["recovery"] == recovery  # counted once


def test_a_failure_after_progress_is_replaced_at_once_and_a_crash_loop_backs_off():
    job = etcd_job(failurePolicy={"backoffSeconds": 10, "maxBackoffSeconds": 300, "maxRestarts": 10})
    step(job, running_pods(job), 0)
    spec = parse_spec(job["spec"])
    fail_node_1(job, 200, snap(7, 150), 1)  # progress since the start: not a crash loop
    assert replacement_delay(spec, job["status"], at(201)) == 0
    for n in (2, 3):
        fail_node_1(job, 200 * n, snap(7, 150), n)  # then stuck at step 7
    assert replacement_delay(spec, job["status"], at(601)) == pytest.approx(20 - 1)  # 2nd in a row: 2x
    fail_node_1(job, 800, snap(8, 790), 4)
    assert replacement_delay(spec, job["status"], at(801)) == 0


def test_a_pass_looks_again_when_an_image_pull_error_reaches_the_timeout():
    job = etcd_job(failurePolicy={"imagePullTimeoutSeconds": 120})
    pod = make_pod(job, 0, phase="Pending", created_at=at(0))
    pod["status"]["containerStatuses"] = [{"name": C.CONTAINER_NAME, "state": {"waiting": {"reason": "ErrImagePull"}}}]
    result = reconcile(job, observe([pod, make_pod(job, 1, phase="Pending", created_at=at(0))]), at(100))
    assert [a for a in result.actions if isinstance(a, Requeue)] == [Requeue(20.0)]
    assert result.status["phase"] == "Pending"


def test_whole_group_restarts_are_judged_by_progress_too():
    # c10d with the store on node 0: node 0 failing restarts the whole group (topology.py),
    # which counts the incident itself; the budget by progress still judges it.
    job = make_ddpjob(replicas=2, failurePolicy={"maxRestarts": 10, "maxRestartsWithoutProgress": 1},
                      elasticPolicy={"rdzvStore": "node"})
    step(job, running_pods(job), 0)
    phases = []
    for n in (1, 2, 3):
        generation = job["status"].get("rendezvousGeneration", 0)
        host = make_pod(job, 0, phase="Failed", exit_code=1, finished_at=at(200 * n), uid=f"host-{n}",
                        created_at=at(200 * n - 5))
        host["metadata"]["labels"][C.LABEL_RDZV_GENERATION] = str(generation)
        other = make_pod(job, 1, uid=f"other-{n}", created_at=at(200 * n - 5))
        other["metadata"]["labels"][C.LABEL_RDZV_GENERATION] = str(generation)
        phases.append(step(job, [with_record(host, snap(30, 100)), other], 200 * n + 1).status["phase"])
    assert phases == ["Restarting", "Restarting", "Failed"]
    assert (job["status"]["restarts"], job["status"]["restartsWithProgress"], job["status"]["restartsWithoutProgress"]) == (3, 1, 2)
    assert next(c for c in job["status"]["conditions"] if c["type"] == "Failed")["reason"] == "NoProgress"
