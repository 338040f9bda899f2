"""Status: phase, conditions, counters and Events from spec + pods + previous status + now."""

from __future__ import annotations

import pytest

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.status import STATUS_FIELDS
from ddpjob_operator.api.validation import parse_spec, validate_spec
from ddpjob_operator.decide.actions import Event
from ddpjob_operator.decide.status import StatusUpdate, compute_status, set_condition
from tests.operator.builders import T0, at, job_ref, make_pod, observe, running_pods
from ddpjob_sandbox.jobs import make_ddpjob
from tests.operator.topology_builders import with_store


def step(job: dict, pods: list, seconds: float) -> StatusUpdate:
    """One status pass at T0+seconds; the job keeps the new status like the API would."""
    errors = validate_spec(job["spec"])
    spec = None if errors else parse_spec(job["spec"])
    pods = with_store(job, pods) if spec else pods
    update = compute_status(job_ref(job), spec, observe(pods), job.get("status"), at(seconds), errors=errors)
    job["status"] = update.status
    return update


def condition(status: dict, type_: str) -> dict:
    return next(c for c in status["conditions"] if c["type"] == type_)


def reasons(update: StatusUpdate) -> list[str]:
    return [e.reason for e in update.events]


def test_a_new_job_is_pending_with_start_time_and_one_created_event():
    job = make_ddpjob(replicas=2)
    first = step(job, [], 0)
    assert (first.status["phase"], first.status["startTime"]) == ("Pending", "2026-01-01T12:00:00Z")
    assert first.events == [Event("Normal", "Created",
                                  "waiting for nodes: 0 of 2 node pods running (minReplicas 2, maxReplicas 2)")]
    assert step(job, [], 5).events == []


def test_running_condition_keeps_its_transition_time_while_it_stays_true():
    job = make_ddpjob(replicas=2)
    step(job, [], 0)
    update = step(job, running_pods(job), 10)
    assert update.status["phase"] == "Running" and reasons(update) == ["NodesRunning"]
    assert condition(update.status, "Running")["lastTransitionTime"] == "2026-01-01T12:00:10Z"
    later = step(job, running_pods(job), 60)
    assert later.events == []
    assert condition(later.status, "Running")["lastTransitionTime"] == "2026-01-01T12:00:10Z"


@pytest.mark.parametrize("running,phase", [(0, "Pending"), (1, "Pending"), (2, "Running"), (3, "Running")])
def test_the_job_runs_once_min_replicas_nodes_run(running, phase):
    job = make_ddpjob(replicas=3, min_replicas=2, max_replicas=4)
    pods = running_pods(job, running) + [make_pod(job, i, phase="Pending") for i in range(running, 3)]
    assert step(job, pods, 0).status["phase"] == phase


def test_counts_ready_string_selector_and_observed_generation():
    job = make_ddpjob(replicas=3, generation=7)
    pods = [make_pod(job, 0), make_pod(job, 1, ready=False), make_pod(job, 2, phase="Pending")]
    status = step(job, pods, 0).status
    assert (status["replicas"], status["readyReplicas"], status["ready"]) == (3, 1, "1/3")
    # the scale selector picks node pods only: an HPA must not count the store pod
    assert (status["selector"], status["observedGeneration"]) == (
        "ddpjob.io/job-name=mlp,app.kubernetes.io/component=node", 7)


def test_a_failed_node_starts_an_incident_counted_once_across_passes():
    job = make_ddpjob(replicas=2)
    step(job, running_pods(job), 0)
    pods = [make_pod(job, 0), make_pod(job, 1, phase="Failed", exit_code=1, finished_at=at(20))]
    update = step(job, pods, 21)
    assert update.status["phase"] == "Restarting"
    assert (update.status["restarts"], update.status["lastFailureTime"]) == (1, "2026-01-01T12:00:20Z")
    assert update.status["handledFailures"] == ["mlp-node-1-uid"]
    assert update.events[0] == Event("Warning", "NodeFailed", (
        "node pod mlp-node-1 failed (exit code 1); 1 of spec.failurePolicy.maxRestarts (5) used"))
    again = step(job, pods, 22)
    assert again.status["restarts"] == 1 and again.events == []


def test_failures_within_the_incident_window_are_one_incident_and_later_ones_are_new():
    # etcd: node 0 is not the store host, so its failure is an ordinary one (under c10d
    # with the store on node 0 it is a whole-group restart: test_topology_status.py).
    job = make_ddpjob(replicas=3, elasticPolicy={"rdzvBackend": "etcd-v3", "rdzvEndpoints": ["etcd:2379"]})
    step(job, running_pods(job), 0)
    step(job, [make_pod(job, 0, phase="Failed", finished_at=at(10)), make_pod(job, 1), make_pod(job, 2)], 11)
    cascade = [make_pod(job, 0, phase="Failed", finished_at=at(10)),
               make_pod(job, 1, phase="Failed", finished_at=at(12)), make_pod(job, 2)]
    assert step(job, cascade, 13).status["restarts"] == 1
    later = [make_pod(job, 0), make_pod(job, 1), make_pod(job, 2, phase="Failed", finished_at=at(300))]
    update = step(job, later, 301)
    assert (update.status["restarts"], update.status["lastFailureTime"]) == (2, "2026-01-01T12:05:00Z")


def test_handled_failures_forget_pods_that_are_gone():
    job = make_ddpjob(replicas=2)
    step(job, [make_pod(job, 0), make_pod(job, 1, phase="Failed")], 0)
    assert step(job, [make_pod(job, 0)], 5).status["handledFailures"] == []


def test_spending_more_than_the_restart_budget_fails_the_job():
    job = make_ddpjob(replicas=1, failurePolicy={"maxRestarts": 1})
    step(job, [make_pod(job, 0, phase="Failed", finished_at=at(0), uid="a")], 1)
    update = step(job, [make_pod(job, 0, phase="Failed", finished_at=at(100), uid="b")], 101)
    assert update.status["phase"] == "Failed"
    assert update.status["completionTime"] == "2026-01-01T12:01:41Z"
    assert condition(update.status, "Failed")["reason"] == "RestartBudgetExhausted"
    assert condition(update.status, "Failed")["message"] == (
        "2 failure incidents exceed spec.failurePolicy.maxRestarts (1)")


def test_a_permanent_exit_code_fails_the_job_at_once():
    job = make_ddpjob(replicas=2)
    update = step(job, [make_pod(job, 0), make_pod(job, 1, phase="Failed", exit_code=127)], 0)
    assert (update.status["phase"], update.status["restarts"]) == ("Failed", 0)
    assert update.events[0] == Event("Warning", "PermanentExitCode", (
        "node pod mlp-node-1 failed (exit code 127); the code is in spec.failurePolicy.permanentExitCodes"))


def test_an_eviction_is_replaced_without_using_the_budget():
    job = make_ddpjob(replicas=2)
    update = step(job, [make_pod(job, 0), make_pod(job, 1, phase="Failed", reason="Evicted")], 0)
    assert (update.status["phase"], update.status["restarts"]) == ("Restarting", 0)
    assert "NodeDisrupted" in reasons(update)


def test_pods_being_deleted_are_not_failures():
    job = make_ddpjob(replicas=2)
    update = step(job, [make_pod(job, 0), make_pod(job, 1, phase="Failed", deleting=True)], 0)
    assert update.status["restarts"] == 0 and "NodeFailed" not in reasons(update)


def test_restarting_lasts_until_enough_replacements_run():
    job = make_ddpjob(replicas=2)
    step(job, [make_pod(job, 0), make_pod(job, 1, phase="Failed", finished_at=at(0))], 0)
    assert step(job, [make_pod(job, 0)], 5).status["phase"] == "Restarting"  # backoff (10 s)
    assert step(job, [make_pod(job, 0), make_pod(job, 1, phase="Pending")], 12).status["phase"] == "Restarting"
    update = step(job, running_pods(job), 20)
    assert update.status["phase"] == "Running" and condition(update.status, "Restarting")["status"] == "False"


def test_all_nodes_exiting_zero_succeed_and_the_phase_never_changes_again():
    job = make_ddpjob(replicas=2)
    step(job, running_pods(job), 0)
    done = [make_pod(job, i, phase="Succeeded") for i in range(2)]
    update = step(job, done, 30)
    assert (update.status["phase"], update.status["completionTime"]) == ("Succeeded", "2026-01-01T12:00:30Z")
    assert update.events == [Event("Normal", "AllNodesSucceeded", "training finished: 2 node pod(s) exited 0")]
    after = step(job, [], 90)
    assert (after.status["phase"], after.status["completionTime"], after.events) == (
        "Succeeded", "2026-01-01T12:00:30Z", [])


def test_a_job_is_not_done_while_a_node_still_runs():
    job = make_ddpjob(replicas=2)
    assert step(job, [make_pod(job, 0, phase="Succeeded"), make_pod(job, 1)], 0).status["phase"] == "Running"


def test_a_replacement_failing_on_the_closed_rendezvous_after_a_node_finished_changes_nothing():
    """The operator's side of decide/failure.py after_finish, as `ddpjob run` applies it: node 1's
    replacement reached the rendezvous after node 0 finished training and torch ended it with exit
    1. Even with 1 listed as permanent and no restart left, the finished node decides: Succeeded,
    nothing charged, one Normal Event, and the pod stays listed in status.failures."""
    job = make_ddpjob(replicas=2, failurePolicy={"permanentExitCodes": [1], "maxRestarts": 0})
    step(job, running_pods(job), 0)
    update = step(job, [make_pod(job, 0, phase="Succeeded"), make_pod(job, 1, phase="Failed", exit_code=1)], 30)
    assert update.status["phase"] == "Succeeded"
    assert (update.status["restarts"], update.status.get("lastFailureTime")) == (0, None)
    assert [(e.type, e.reason, e.message) for e in update.events if e.reason == C.REASON_EXITED_AFTER_FINISH] == [
        ("Normal", "ExitedAfterFinish", "node pod mlp-node-1 failed (exit code 1) after training finished; not "
                                        "counted: the nodes that finished decide the job's result")]
    assert C.REASON_PERMANENT_ERROR not in reasons(update) and C.REASON_NODE_FAILED not in reasons(update)
    assert [f["pod"] for f in update.status["failures"]] == ["mlp-node-1"]


def test_a_permanent_failure_before_the_others_finished_fails_the_job_whenever_the_pass_sees_it():
    """The order of the exits decides, not the pass that sees them: node 1 failed during training
    (the others re-formed and finished without it), so the job fails even seen in one pass."""
    job = make_ddpjob(replicas=2, min_replicas=1, max_replicas=2, failurePolicy={"permanentExitCodes": [1]})
    step(job, running_pods(job), 0)
    pods = [make_pod(job, 0, phase="Succeeded", finished_at=at(60)), make_pod(job, 1, phase="Failed", finished_at=at(20))]
    update = step(job, pods, 61)
    assert (update.status["phase"], condition(update.status, "Failed")["reason"]) == ("Failed", C.REASON_PERMANENT_ERROR)
    job = make_ddpjob(replicas=2, min_replicas=1, max_replicas=2, failurePolicy={"permanentExitCodes": [1]})
    step(job, running_pods(job), 0)
    pods[1] = make_pod(job, 1, phase="Failed", finished_at=at(60))  # the same second: after the finish
    assert step(job, pods, 61).status["phase"] == "Succeeded"


def test_a_node_failing_while_another_finishes_is_counted_once_and_the_job_still_succeeds():
    """Node 1 still runs when node 0 exits 0, then fails: reported once, while the job waits."""
    job = make_ddpjob(replicas=3, min_replicas=1, max_replicas=3)
    step(job, running_pods(job), 0)
    finishing = [make_pod(job, 0, phase="Succeeded"), make_pod(job, 1, phase="Failed"), make_pod(job, 2)]
    first = step(job, finishing, 5)
    assert first.status["phase"] == "Running" and reasons(first).count(C.REASON_EXITED_AFTER_FINISH) == 1
    assert C.REASON_EXITED_AFTER_FINISH not in reasons(step(job, finishing, 6)), "one Event per pod"
    done = step(job, finishing[:2] + [make_pod(job, 2, phase="Succeeded")], 7)
    assert done.status["phase"] == "Succeeded" and done.status["restarts"] == 0


def test_suspending_clears_start_time_and_resuming_says_resumed():
    job = make_ddpjob(replicas=2)
    step(job, running_pods(job), 0)
    job["spec"]["runPolicy"] = {"suspend": True}
    update = step(job, running_pods(job), 10)
    assert (update.status["phase"], "startTime" in update.status) == ("Suspended", False)
    assert condition(update.status, "Suspended")["status"] == "True"
    job["spec"]["runPolicy"] = {"suspend": False}
    resumed = step(job, [], 20)
    assert (resumed.status["phase"], resumed.status["startTime"]) == ("Pending", "2026-01-01T12:00:20Z")
    assert reasons(resumed) == ["Resumed"]
    assert condition(resumed.status, "Suspended")["status"] == "False"


def test_passing_the_active_deadline_fails_the_job():
    job = make_ddpjob(replicas=1, runPolicy={"activeDeadlineSeconds": 60})
    step(job, running_pods(job), 0)
    assert step(job, running_pods(job), 59).status["phase"] == "Running"
    update = step(job, running_pods(job), 60)
    assert update.status["phase"] == "Failed"
    assert update.events == [Event("Warning", "DeadlineExceeded",
                                   "the job ran longer than spec.runPolicy.activeDeadlineSeconds (60)")]


def test_an_invalid_spec_sets_invalid_spec_once_and_clears_it_when_fixed():
    job = make_ddpjob(replicas=2)
    job["spec"]["elasticPolicy"] = {"rdzvBackend": "etcd"}
    update = step(job, [], 0)
    message = ("spec.elasticPolicy.rdzvEndpoints ([]) must list at least one etcd host:port "
               "when rdzvBackend is etcd (or set managedEtcd.enabled: true)")
    assert update.status["phase"] == "Failed" and "completionTime" not in update.status
    assert condition(update.status, "InvalidSpec") == {
        "type": "InvalidSpec", "status": "True", "reason": "InvalidSpec", "message": message,
        "lastTransitionTime": "2026-01-01T12:00:00Z"}
    assert update.events == [Event("Warning", "InvalidSpec", message)]
    assert step(job, [], 5).events == []
    job["spec"]["elasticPolicy"] = {}
    fixed = step(job, [], 10)
    assert fixed.status["phase"] == "Pending"
    assert condition(fixed.status, "InvalidSpec")["status"] == "False"


def test_the_status_holds_the_status_models_fields_in_its_order():
    job = make_ddpjob(replicas=2, status={"lastSnapshot": {"epoch": 3, "step": 120, "time": "2026-01-01T11:00:00Z"},
                                          "notAStatusField": 1})
    step(job, running_pods(job), 0)
    status = step(job, [make_pod(job, 0), make_pod(job, 1, phase="Failed", exit_code=1, finished_at=at(20))], 21).status
    assert list(status) == [key for key in STATUS_FIELDS if key in status]
    assert {"restarts", "failures", "lastSnapshot", "readyReplicas"} <= set(status) and "notAStatusField" not in status


def test_last_snapshot_is_kept_from_the_previous_status():
    job = make_ddpjob(status={"lastSnapshot": {"epoch": 3, "step": 120, "time": "2026-01-01T11:00:00Z"}})
    assert step(job, [], 0).status["lastSnapshot"]["step"] == 120


@pytest.mark.parametrize("old,new,moved", [("True", "True", False), ("True", "False", True), ("False", "True", True)])
def test_set_condition_moves_last_transition_time_only_when_the_status_flips(old, new, moved):
    before = [{"type": "Running", "status": old, "reason": "A", "message": "a", "lastTransitionTime": "t0"}]
    (after,) = set_condition(before, "Running", new, "B", "b", "t1")
    assert after == {"type": "Running", "status": new, "reason": "B", "message": "b",
                     "lastTransitionTime": "t1" if moved else "t0"}


def test_unset_fields_are_left_out_so_a_status_read_back_compares_equal():
    job = make_ddpjob(replicas=2)
    first = step(job, running_pods(job), 0).status
    assert {"lastFailureTime", "completionTime", "lastSnapshot"}.isdisjoint(first)
    assert step(job, running_pods(job), 5).status == first


def test_a_live_record_with_a_newer_snapshot_replaces_last_snapshot_keeping_only_its_known_keys():
    job = make_ddpjob(status={"lastSnapshot": {"epoch": 3, "step": 120, "time": "2026-01-01T11:00:00Z"}})
    newer = {"epoch": 4, "step": 160, "time": "2026-01-01T12:00:00Z", "path": "/s/e4", "samples_consumed": 1}
    live = [{"kind": "ddpjob.progress", "version": 1, "snapshot": newer, "resume": None}]
    update = compute_status(job_ref(job), parse_spec(job["spec"]), observe(live_progress=live), job["status"], at(0))
    assert update.status["lastSnapshot"] == {"epoch": 4, "step": 160, "time": "2026-01-01T12:00:00Z",
                                             "path": "/s/e4"}
    older = [{**live[0], "snapshot": {**newer, "step": 80, "time": "2026-01-01T10:00:00Z"}}]
    kept = compute_status(job_ref(job), parse_spec(job["spec"]), observe(live_progress=older), job["status"], at(0))
    assert kept.status["lastSnapshot"]["step"] == 120, "a node that lags behind never moves lastSnapshot back"


def test_pods_that_never_started_do_not_hold_up_success():
    job = make_ddpjob(replicas=4, min_replicas=2, max_replicas=4)
    pods = [make_pod(job, 0, phase="Succeeded"), make_pod(job, 1, phase="Succeeded"),
            make_pod(job, 2, phase="Pending"), make_pod(job, 3, phase="Pending")]
    assert step(job, pods, 0).status["phase"] == "Succeeded"


def test_a_replacement_that_fails_again_is_a_new_incident_even_within_the_window():
    job = make_ddpjob(replicas=2)
    step(job, [make_pod(job, 0), make_pod(job, 1, phase="Failed", finished_at=at(0))], 0)
    crash = make_pod(job, 1, phase="Failed", finished_at=at(15), created_at=at(10), uid="replacement")
    update = step(job, [make_pod(job, 0), crash], 16)
    assert (update.status["restarts"], update.status["lastFailureTime"]) == (2, "2026-01-01T12:00:15Z")


def test_a_finish_time_ahead_of_the_operator_clock_is_taken_as_now():
    job = make_ddpjob(replicas=1)
    update = step(job, [make_pod(job, 0, phase="Failed", finished_at=at(500))], 10)
    assert update.status["lastFailureTime"] == "2026-01-01T12:00:10Z"


# A node pod that failed on its own is counted however late the operator looks: the user's
# suspension or scale-down that came after it (and removes the pod) must not hide it.

def test_a_node_that_failed_before_the_suspension_was_seen_is_still_counted():
    job = make_ddpjob(replicas=2)
    step(job, running_pods(job), 0)
    job["spec"]["runPolicy"] = {"suspend": True}
    update = step(job, [make_pod(job, 0), make_pod(job, 1, phase="Failed", exit_code=137, finished_at=at(20))], 21)
    assert (update.status["phase"], update.status["restarts"]) == ("Suspended", 1)
    assert update.status["handledFailures"] == ["mlp-node-1-uid"]
    assert [f["pod"] for f in update.status["failures"]] == ["mlp-node-1"]
    assert reasons(update)[:1] == ["NodeFailed"]
    assert step(job, [], 30).status["restarts"] == 1  # counted once, though the pod is gone


def test_a_node_the_suspension_is_deleting_is_not_counted():
    job = make_ddpjob(replicas=2)
    step(job, running_pods(job), 0)
    job["spec"]["runPolicy"] = {"suspend": True}
    update = step(job, [make_pod(job, 0, phase="Failed", exit_code=143, deleting=True)], 10)
    assert (update.status["phase"], update.status["restarts"]) == ("Suspended", 0)
    assert "NodeFailed" not in reasons(update)


def test_a_permanent_failure_seen_with_the_suspension_fails_the_job():
    job = make_ddpjob(replicas=2)
    step(job, running_pods(job), 0)
    job["spec"]["runPolicy"] = {"suspend": True}
    update = step(job, [make_pod(job, 0), make_pod(job, 1, phase="Failed", exit_code=127)], 10)
    assert (update.status["phase"], condition(update.status, "Failed")["reason"]) == ("Failed", "PermanentExitCode")


def test_a_node_that_failed_before_a_scale_down_was_seen_is_still_counted():
    job = make_ddpjob(replicas=2, min_replicas=1, max_replicas=2)
    step(job, running_pods(job), 0)
    job["spec"]["replicas"] = 1
    update = step(job, [make_pod(job, 0), make_pod(job, 1, phase="Failed", exit_code=1, finished_at=at(20))], 21)
    assert (update.status["restarts"], update.status["handledFailures"]) == (1, ["mlp-node-1-uid"])
    assert "NodeFailed" in reasons(update)


def events_of(update: StatusUpdate, reason: str) -> list[Event]:
    return [e for e in update.events if e.reason == reason]


def test_a_permanent_exit_code_is_reported_by_one_event():
    """The verdict's Event is posted once, as the phase changes: the rule that found the exit
    code used to post it too, so one pass posted it twice."""
    job = make_ddpjob(replicas=2)
    step(job, running_pods(job), 0)
    update = step(job, [make_pod(job, 0), make_pod(job, 1, phase="Failed", exit_code=127)], 5)
    assert events_of(update, C.REASON_PERMANENT_ERROR) == [Event("Warning", "PermanentExitCode", (
        "node pod mlp-node-1 failed (exit code 127); the code is in spec.failurePolicy.permanentExitCodes"))]
    assert step(job, [make_pod(job, 0), make_pod(job, 1, phase="Failed", exit_code=127)], 6).events == []


def test_a_spent_restart_budget_is_reported_by_one_event():
    job = make_ddpjob(replicas=2, failurePolicy={"maxRestarts": 0})
    step(job, running_pods(job), 0)
    update = step(job, [make_pod(job, 0), make_pod(job, 1, phase="Failed", exit_code=1)], 5)
    assert update.status["phase"] == "Failed"
    assert [e.reason for e in update.events] == [C.REASON_NODE_FAILED, C.REASON_RESTARTS_EXHAUSTED]


def test_a_permanent_failure_keeps_its_reason_when_another_node_fails_in_the_same_pass():
    job = make_ddpjob(replicas=2)
    step(job, running_pods(job), 0)
    update = step(job, [make_pod(job, 0, phase="Failed", exit_code=127), make_pod(job, 1, phase="Failed", exit_code=1)], 5)
    assert condition(update.status, "Failed")["reason"] == C.REASON_PERMANENT_ERROR
    assert len(events_of(update, C.REASON_PERMANENT_ERROR)) == 1


def test_a_job_whose_spec_is_fixed_and_whose_node_then_fails_permanently_says_so_once():
    """Failed (InvalidSpec) to Failed (PermanentExitCode): the phase stays, the news is the reason."""
    job = make_ddpjob(replicas=2)
    job["spec"]["replicas"] = 0
    assert step(job, [], 0).status["phase"] == "Failed"
    job["spec"]["replicas"] = 2
    update = step(job, [make_pod(job, 0), make_pod(job, 1, phase="Failed", exit_code=127)], 5)
    assert (update.status["phase"], condition(update.status, "Failed")["reason"]) == ("Failed", "PermanentExitCode")
    assert len(events_of(update, C.REASON_PERMANENT_ERROR)) == 1
