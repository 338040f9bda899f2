"""A job's history in Events and status: the finishing wait, pods deleted by someone, scaling."""

from __future__ import annotations

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.clock import format_time
from ddpjob_operator.decide.actions import DeletePod, Event, Requeue
from ddpjob_operator.decide.reconcile import reconcile
from tests.operator.builders import at, make_pod, observe, running_pods
from ddpjob_sandbox.jobs import make_ddpjob
from tests.operator.topology_builders import with_store


def run_pass(job: dict, pods: list, seconds: float):
    """One reconcile pass at T0+seconds; the job keeps the new status like the API would."""
    result = reconcile(job, observe(with_store(job, pods)), at(seconds))
    job["status"] = result.status
    return result


def events_of(result, *reasons: str) -> list[Event]:
    return [e for e in result.events if e.reason in reasons]


def finishing_pods(job: dict) -> list:
    """Node 0 exited 0 at T0+100; nodes 1 and 2 still run (waiting in torchrun's exit barrier)."""
    return [make_pod(job, 0, phase="Succeeded", finished_at=at(100)), make_pod(job, 1), make_pod(job, 2)]


def requeue_of(result) -> float:
    return next(a.after for a in result.actions if isinstance(a, Requeue))


FINISH_REASONS = (C.REASON_FINISHING, C.REASON_FINISH_STOPPED)


def test_pods_still_running_after_training_finished_are_waited_for_then_stopped_with_one_event_each():
    job = make_ddpjob(replicas=3)
    run_pass(job, running_pods(job), 0)
    waiting = run_pass(job, finishing_pods(job), 101)
    assert events_of(waiting, *FINISH_REASONS) == [Event("Normal", "WaitingForNodesToFinish", (
        "waiting for 2 node pod(s) after training finished: mlp-node-1, mlp-node-2; those still running "
        "15s after the first node pod exited 0 are stopped"))]
    assert waiting.status["phase"] == "Running" and waiting.status["finishing"] == {"since": "2026-01-01T12:01:40Z"}
    assert not [a for a in waiting.actions if isinstance(a, DeletePod)]
    assert requeue_of(waiting) <= 14.0  # the pass looks again by the end of the grace (15 s after the first exit)

    still = run_pass(job, finishing_pods(job), 110)
    assert events_of(still, *FINISH_REASONS) == [] and not [a for a in still.actions if isinstance(a, DeletePod)]
    assert requeue_of(still) <= 5.0

    stopped = run_pass(job, finishing_pods(job), 115)
    assert events_of(stopped, *FINISH_REASONS) == [Event("Warning", "StoppedAfterFinish", (
        "stopped 2 node pod(s) still running 15s after training finished: mlp-node-1, mlp-node-2"))]
    assert stopped.status["finishing"] == {"since": "2026-01-01T12:01:40Z", "stopped": 2}
    assert sorted(a.name for a in stopped.actions if isinstance(a, DeletePod)) == ["mlp-node-1", "mlp-node-2"]

    going = [make_pod(job, 0, phase="Succeeded", finished_at=at(100)),
             make_pod(job, 1, deleting=True), make_pod(job, 2, deleting=True)]
    done = run_pass(job, going, 116)
    assert done.status["phase"] == "Succeeded" and events_of(done, *FINISH_REASONS) == []
    assert done.status["restarts"] == 0 and "failures" not in done.status  # stopping them is no failure


def test_pods_that_exit_within_the_grace_end_the_job_without_a_stop():
    job = make_ddpjob(replicas=3)
    run_pass(job, running_pods(job), 0)
    run_pass(job, finishing_pods(job), 101)
    done = run_pass(job, [make_pod(job, i, phase="Succeeded", finished_at=at(103)) for i in range(3)], 104)
    assert done.status["phase"] == "Succeeded" and events_of(done, C.REASON_FINISH_STOPPED) == []
    assert done.status["finishing"] == {"since": "2026-01-01T12:01:40Z"}


def test_nodes_that_finish_together_post_no_finishing_event():
    job = make_ddpjob(replicas=2)
    run_pass(job, running_pods(job), 0)
    done = run_pass(job, [make_pod(job, i, phase="Succeeded", finished_at=at(100)) for i in range(2)], 101)
    assert done.status["phase"] == "Succeeded" and events_of(done, *FINISH_REASONS) == []
    assert "finishing" not in done.status


def test_a_pod_deleted_by_someone_is_listed_as_deleted_reported_once_and_not_charged():
    job = make_ddpjob(replicas=3)
    run_pass(job, running_pods(job), 0)
    pods = [make_pod(job, 0), make_pod(job, 1, deleting=True), make_pod(job, 2)]
    first = run_pass(job, pods, 10)
    assert events_of(first, C.REASON_POD_DELETED) == [Event("Warning", "NodePodDeleted", (
        "node pod mlp-node-1 was deleted while training (not by the operator, no DisruptionTarget); "
        "it is replaced without using the restart budget"))]
    assert first.status["failures"] == [{
        "index": 1, "pod": "mlp-node-1", "podUID": "mlp-node-1-uid", "cause": "Deleted", "reason": "Deleted",
        "message": "deleted while it ran; not by the operator and without a DisruptionTarget condition",
        "time": "2026-01-01T12:00:10Z"}]
    assert first.status["restarts"] == 0
    again = run_pass(job, pods, 12)
    assert events_of(again, C.REASON_POD_DELETED) == [] and len(again.status["failures"]) == 1
    # Gone: the index is created again at once (no incident, so no backoff).
    gone = run_pass(job, [make_pod(job, 0), make_pod(job, 2)], 14)
    assert [a.body["metadata"]["name"] for a in gone.actions if hasattr(a, "body") and a.body.get("kind") == "Pod"] \
        == ["mlp-node-1"]
    assert gone.status["restarts"] == 0


def test_the_operators_own_deletions_are_not_reported_as_deleted_by_someone():
    job = make_ddpjob(replicas=2, elasticPolicy={"minReplicas": 1, "maxReplicas": 3})
    run_pass(job, running_pods(job, 3), 0)  # scaled in from 3: node 2 is the operator's to delete
    scale_down = run_pass(job, [make_pod(job, 0), make_pod(job, 1), make_pod(job, 2, deleting=True)], 5)
    failed = run_pass(job, [make_pod(job, 0), make_pod(job, 1, phase="Failed", exit_code=1, deleting=True)], 10)
    finishing = run_pass(job, [make_pod(job, 0, phase="Succeeded", finished_at=at(11)),
                               make_pod(job, 1, deleting=True)], 12)
    for result in (scale_down, failed, finishing):
        assert events_of(result, C.REASON_POD_DELETED) == []
        assert "Deleted" not in [f["cause"] for f in result.status.get("failures") or []]


def test_scaling_out_and_in_posts_one_event_each():
    job = make_ddpjob(replicas=2, elasticPolicy={"minReplicas": 1, "maxReplicas": 4})
    run_pass(job, running_pods(job), 0)
    job["spec"]["replicas"] = 3
    out = run_pass(job, running_pods(job, 2), 10)
    assert events_of(out, C.REASON_SCALED) == [Event("Normal", "Scaled", "scaled out from 2 to 3 node(s) (spec.replicas)")]
    assert events_of(run_pass(job, running_pods(job, 3), 11), C.REASON_SCALED) == []
    job["spec"]["replicas"] = 1
    scaled_in = run_pass(job, running_pods(job, 3), 20)
    assert events_of(scaled_in, C.REASON_SCALED) == [Event("Normal", "Scaled", "scaled in from 3 to 1 node(s) (spec.replicas)")]


def live_record(node: int, worker_restarts: int) -> dict:
    """What node `node`'s progress endpoint serves after torchrun restarted its workers `worker_restarts` times."""
    return {"kind": C.PROGRESS_RECORD_KIND, "version": 1, "node": str(node), "snapshot": None,
            "resume": {"time": "2026-01-01T12:00:05Z", "fromStep": None, "fromSnapshotTime": None,
                       "firstStepTime": None, "workerRestarts": worker_restarts}}


def test_torchruns_restarts_inside_a_pod_are_counted_once_each_with_one_event_per_rise():
    job = make_ddpjob(replicas=2)
    pods = running_pods(job)

    def live_pass(seconds, *records):
        result = reconcile(job, observe(with_store(job, pods), live_progress=records), at(seconds))
        job["status"] = result.status
        return result

    live_pass(0, live_record(0, 0), live_record(1, 0))
    first = live_pass(10, live_record(0, 1), live_record(1, 1))
    assert events_of(first, C.REASON_WORKER_RESTART) == [
        Event("Normal", "WorkersRestarted", f"torchrun restarted the workers of node pod mlp-node-{i} (restart 1 of "
                                            "this container; a worker failed, or a node joined or left)")
        for i in (0, 1)]
    assert first.status["workerRestarts"] == 2 and first.status["restarts"] == 0
    assert events_of(live_pass(20, live_record(0, 1), live_record(1, 1)), C.REASON_WORKER_RESTART) == []
    third = live_pass(30, live_record(1, 3))  # two more on node 1, seen at once
    assert [e.message.split(" (")[0] for e in events_of(third, C.REASON_WORKER_RESTART)] == [
        "torchrun restarted the workers of node pod mlp-node-1"]
    assert third.status["workerRestarts"] == 4
    assert third.status["workerRestartsByPod"] == [
        {"pod": "mlp-node-0", "podUID": "mlp-node-0-uid", "count": 1},
        {"pod": "mlp-node-1", "podUID": "mlp-node-1-uid", "count": 3}]


def resumed_record(node: int, from_step: int, snapshot_seconds: float) -> dict:
    """Node `node`'s live record: it resumed at T0+5 from the step-`from_step` snapshot completed at
    T0+snapshot_seconds, and made its first step at T0+8."""
    return {"kind": C.PROGRESS_RECORD_KIND, "version": 1, "node": str(node), "snapshot": None,
            "resume": {"time": format_time(at(5)), "fromStep": from_step,
                       "fromSnapshotTime": format_time(at(snapshot_seconds)), "firstStepTime": format_time(at(8))}}


def test_a_first_run_resuming_from_an_earlier_jobs_snapshot_says_so_once_and_counts_no_loss():
    job = make_ddpjob(replicas=2)
    job["metadata"]["creationTimestamp"] = format_time(at(0))
    pods = running_pods(job)

    def live_pass(seconds, *records):
        result = reconcile(job, observe(with_store(job, pods), live_progress=records), at(seconds))
        job["status"] = result.status
        return result

    live_pass(0)
    first = live_pass(10, resumed_record(0, 500, -3600), resumed_record(1, 500, -3600))
    assert events_of(first, C.REASON_RESUMED_FROM_EARLIER_JOB) == [Event("Normal", "ResumedFromEarlierJob", (
        "resumed from the snapshot at step 500, completed 2026-01-01T11:00:00Z, before this job was created: "
        "an earlier job's, on the same snapshot volume; to start from scratch, give the job a new volume or "
        "remove its snapshots"))]
    recovery = first.status["recovery"]
    assert recovery["resumedFromEarlierJob"] == {"time": "2026-01-01T11:00:00Z", "fromStep": 500}
    # An hour-old snapshot is not an hour of start-up: the job's own start (T0) to its first step (T0+8) is.
    assert recovery["startupSeconds"] == 8.0 and not recovery.get("lostSeconds")
    again = live_pass(20, resumed_record(0, 500, -3600), resumed_record(1, 500, -3600))
    assert events_of(again, C.REASON_RESUMED_FROM_EARLIER_JOB) == []


def test_resuming_from_the_jobs_own_snapshot_is_no_earlier_job():
    job = make_ddpjob(replicas=2)
    job["metadata"]["creationTimestamp"] = format_time(at(0))
    result = reconcile(job, observe(with_store(job, running_pods(job)),
                                    live_progress=[resumed_record(0, 40, 3)]), at(10))
    assert events_of(result, C.REASON_RESUMED_FROM_EARLIER_JOB) == []
    assert "resumedFromEarlierJob" not in (result.status.get("recovery") or {})
