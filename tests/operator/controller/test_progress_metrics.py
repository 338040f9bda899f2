"""Recovery metrics derived from status changes: failures by cause, incidents by progress,
time to recover, lost time and goodput; the per-job phase, restart budget and step clock."""
from __future__ import annotations

import pytest

from ddpjob_operator.api.validation import parse_spec
from ddpjob_operator.controller import metrics
from ddpjob_operator.decide.budget import budget_limit_passed, budget_use, ledger_of
from ddpjob_sandbox.jobs import make_ddpjob
from tests.operator.builders import at

REG = metrics.REGISTRY


def value(metric, **labels):
    return REG.get_sample_value(metric, labels) or 0.0


def test_a_status_write_counts_new_failures_by_cause_and_incidents_by_progress():
    before = {c: value("ddpjob_operator_node_failures_total", cause=c) for c in ("Error", "Disrupted")}
    progress = {p: value("ddpjob_operator_restarts_total", progress=p) for p in ("true", "false", "unknown")}
    old = {"restarts": 1, "failures": [{"podUID": "a", "cause": "Error"}]}
    new = {"restarts": 3, "restartsWithProgress": 1, "lastSnapshot": {"step": 5},
           "failures": [{"podUID": "a", "cause": "Error"}, {"podUID": "b", "cause": "Error"},
                        {"podUID": "c", "cause": "Disrupted"}]}
    metrics.observe_status_change(old, new)
    assert value("ddpjob_operator_node_failures_total", cause="Error") == before["Error"] + 1
    assert value("ddpjob_operator_node_failures_total", cause="Disrupted") == before["Disrupted"] + 1
    assert value("ddpjob_operator_restarts_total", progress="true") == progress["true"] + 1
    assert value("ddpjob_operator_restarts_total", progress="false") == progress["false"] + 1
    metrics.observe_status_change(new, new)  # nothing new: nothing counted
    assert value("ddpjob_operator_restarts_total", progress="false") == progress["false"] + 1


def test_a_recovery_is_observed_once_per_incident():
    count = value("ddpjob_operator_time_to_recover_seconds_count")
    total = value("ddpjob_operator_time_to_recover_seconds_sum")
    recovered = {"recovery": {"recoveredFailureTime": "2026-01-01T12:00:00Z", "lastRecoverySeconds": 42.5}}
    metrics.observe_status_change({}, recovered)
    metrics.observe_status_change(recovered, recovered)
    assert value("ddpjob_operator_time_to_recover_seconds_count") == count + 1
    assert value("ddpjob_operator_time_to_recover_seconds_sum") == pytest.approx(total + 42.5)


@pytest.mark.parametrize("status,now,ratio", [
    ({"startTime": "2026-01-01T12:00:00Z", "recovery": {"lostSeconds": 25, "lastResume": {"time": "x"}}}, 100, 0.75),
    ({"startTime": "2026-01-01T12:00:00Z", "completionTime": "2026-01-01T12:00:50Z",
      "recovery": {"lostSeconds": 25, "lastResume": {"time": "x"}}}, 1000, 0.5),
    ({"startTime": "2026-01-01T12:00:00Z", "recovery": {"lostSeconds": 500, "lastResume": {"time": "x"}}}, 100, 0.0),
    ({"startTime": "2026-01-01T12:00:00Z"}, 100, None),  # no run reported yet: unknown, not 1.0
])
def test_goodput_is_the_share_of_wall_time_not_lost(status, now, ratio):
    assert metrics.goodput(status, at(now)) == (pytest.approx(ratio) if ratio is not None else None)


def test_the_per_job_gauges_follow_the_job_and_go_with_it():
    status = {"startTime": "2026-01-01T12:00:00Z", "recovery": {"lostSeconds": 10, "lastResume": {"time": "x"}}}
    metrics.observe_goodput("ns", "job", status, at(40))
    assert value("ddpjob_operator_goodput_ratio", namespace="ns", name="job") == pytest.approx(0.75)
    assert value("ddpjob_operator_lost_training_seconds", namespace="ns", name="job") == 10
    metrics.observe_job("ns", "job", None)
    assert REG.get_sample_value("ddpjob_operator_goodput_ratio", {"namespace": "ns", "name": "job"}) is None


def test_the_slowdown_gauge_follows_the_slowest_node_and_goes_with_the_job():
    slow = "ddpjob_operator_straggler_slowdown_ratio"
    metrics.observe_goodput("ns", "slowjob", {"progress": {"slowestNode": "2", "slowdown": 3.5}}, at(0))
    assert value(slow, namespace="ns", name="slowjob", node="2") == 3.5
    metrics.observe_goodput("ns", "slowjob", {"progress": {"slowestNode": "0", "slowdown": 1.1}}, at(1))
    assert REG.get_sample_value(slow, {"namespace": "ns", "name": "slowjob", "node": "2"}) is None
    assert value(slow, namespace="ns", name="slowjob", node="0") == 1.1
    metrics.observe_job("ns", "slowjob", None)
    assert REG.get_sample_value(slow, {"namespace": "ns", "name": "slowjob", "node": "0"}) is None


def budget_gauges(namespace, name):
    """{budget: (used, limit)} as the registry holds them for one job (None where a series is absent)."""
    return {budget: (REG.get_sample_value("ddpjob_operator_restart_budget_used",
                                          {"namespace": namespace, "name": name, "budget": budget}),
                     REG.get_sample_value("ddpjob_operator_restart_budget_limit",
                                          {"namespace": namespace, "name": name, "budget": budget}))
            for budget in ("maxRestarts", "maxRestartsWithoutProgress")}


@pytest.mark.parametrize("status,policy,expected", [
    ({}, {"maxRestarts": 4}, {"maxRestarts": (0, 4), "maxRestartsWithoutProgress": (0, 3)}),
    # 5 incidents, 2 after a newer snapshot (free): 3 charged; the last 2 in a row without progress.
    ({"restarts": 5, "restartsWithProgress": 2, "restartsWithoutProgress": 2},
     {"maxRestarts": 4, "maxRestartsWithoutProgress": 2}, {"maxRestarts": (3, 4), "maxRestartsWithoutProgress": (2, 2)}),
    # No progress was ever reported: every incident is charged, the streak is not known.
    ({"restarts": 2}, {"maxRestarts": 2, "maxRestartsWithoutProgress": None},
     {"maxRestarts": (2, 2), "maxRestartsWithoutProgress": (None, None)}),
])
def test_the_restart_budget_gauges_show_each_limit_and_what_the_status_charged_to_it(status, policy, expected):
    job = make_ddpjob(failurePolicy=policy, status=status)
    metrics.observe_budget("ns", "budget-job", job["status"], parse_spec(job["spec"]))
    assert budget_gauges("ns", "budget-job") == expected
    metrics.observe_job("ns", "budget-job", None)
    assert budget_gauges("ns", "budget-job") == {b: (None, None) for b in expected}


@pytest.mark.parametrize("status", [
    {"restarts": 3}, {"restarts": 4}, {"restarts": 6, "restartsWithProgress": 2, "restartsWithoutProgress": 1},
    {"restarts": 5, "restartsWithProgress": 1, "restartsWithoutProgress": 3},
])
def test_used_above_limit_is_exactly_when_the_budget_fails_the_job(status):
    """The gauges use the budget's own rule: used == limit still recovers, one more fails."""
    policy = parse_spec(make_ddpjob(failurePolicy={"maxRestarts": 3, "maxRestartsWithoutProgress": 2})["spec"]).failure_policy
    over = {field for field, (used, limit) in budget_use(status, policy).items() if used > limit}
    passed = budget_limit_passed(ledger_of(status).budget, policy.max_restarts, policy.max_restarts_without_progress)
    assert (passed is None) == (not over) and (passed is None or passed in over)


def test_a_limit_taken_off_the_spec_takes_its_series_with_it():
    job = make_ddpjob(failurePolicy={"maxRestartsWithoutProgress": 1}, status={"restarts": 1})
    metrics.observe_budget("ns", "lifted", job["status"], parse_spec(job["spec"]))
    assert budget_gauges("ns", "lifted")["maxRestartsWithoutProgress"] == (0, 1)
    lifted = make_ddpjob(failurePolicy={"maxRestartsWithoutProgress": None}, status={"restarts": 1})
    metrics.observe_budget("ns", "lifted", lifted["status"], parse_spec(lifted["spec"]))
    assert budget_gauges("ns", "lifted")["maxRestartsWithoutProgress"] == (None, None)
    metrics.observe_job("ns", "lifted", None)


def test_the_phase_gauge_holds_one_series_per_job_under_its_current_phase():
    phase = "ddpjob_operator_job_phase"
    metrics.observe_job("ns", "phased", "Running")
    metrics.observe_job("ns", "phased", "Failed")
    assert REG.get_sample_value(phase, {"namespace": "ns", "name": "phased", "phase": "Running"}) is None
    assert REG.get_sample_value(phase, {"namespace": "ns", "name": "phased", "phase": "Failed"}) == 1
    metrics.observe_job("ns", "phased", None)
    assert REG.get_sample_value(phase, {"namespace": "ns", "name": "phased", "phase": "Failed"}) is None


def test_the_step_advanced_gauge_is_the_status_time_and_goes_while_no_step_is_known():
    stamp = "ddpjob_operator_step_advanced_timestamp_seconds"
    metrics.observe_step_advanced("ns", "stepping", {"progress": {"advancedTime": "2026-01-01T12:00:40Z"}})
    assert REG.get_sample_value(stamp, {"namespace": "ns", "name": "stepping"}) == at(40).timestamp()
    metrics.observe_step_advanced("ns", "stepping", {"progress": {"step": 7}})  # a new run, no step yet
    assert REG.get_sample_value(stamp, {"namespace": "ns", "name": "stepping"}) is None
