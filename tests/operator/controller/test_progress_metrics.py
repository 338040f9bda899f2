"""Recovery metrics derived from status changes: failures by cause, incidents by progress,
time to recover, lost time and goodput."""
from __future__ import annotations

import pytest

from ddpjob_operator.controller import metrics
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
