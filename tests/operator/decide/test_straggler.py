"""Straggler detection, pure (decide/straggler.py): the slowest node against the median, a Warning
Event once it stays slow for the window, and under Replace its pod deleted (free, its node named)."""

from __future__ import annotations

import pytest

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.clock import format_time
from ddpjob_operator.api.validation import validate_spec
from ddpjob_operator.decide import straggler
from ddpjob_operator.decide.actions import DeletePod
from ddpjob_operator.decide.observed import liveness_of
from ddpjob_operator.decide.reconcile import reconcile
from ddpjob_sandbox.jobs import make_ddpjob
from tests.operator.builders import at, observe
from tests.operator.topology_builders import ETCD_V3, gen_pod


def record(step, own=(0.02, 0.02, 0.02), step_seconds=0.5):
    nodes = [{"node": str(i), "step": step, "phase": "collective", "heartbeat": format_time(at(0)),
              "stepSeconds": step_seconds, "dataSeconds": seconds / 2, "computeSeconds": seconds / 2}
             for i, seconds in enumerate(own)]
    return {"kind": C.PROGRESS_RECORD_KIND, "version": 1, "node": "0", "resume": {"time": format_time(at(-100))},
            "nodes": nodes}


def job(**policy):
    body = make_ddpjob(replicas=3, **ETCD_V3, stragglerPolicy={"windowSeconds": 30, **policy})
    body["status"] = {"phase": C.PHASE_RUNNING}
    return body


def running(body):
    pods = [gen_pod(body, i, 0) for i in range(3)]
    for i, pod in enumerate(pods):
        pod["spec"]["nodeName"] = f"gpu-{i}"
    return pods


def step(body, seconds, live):
    result = reconcile(body, observe(running(body), live_progress=live), at(seconds))
    body["status"] = result.status
    return result


@pytest.mark.parametrize(("own", "slowest", "slowdown"), [
    ((0.02, 0.02, 0.02), "0", 1.0),
    ((0.02, 0.27, 0.02), "1", 2.0),  # 0.25 s of a 0.5 s step is node 1's alone: twice as slow as needed
    ((0.02, 0.02, 0.5), "2", 25.0),  # 0.48 s of 0.5: the step would take 0.02 s without it
    ((0.02, 0.02, 0.9), "2", 100.0),  # more than the step (figures of different steps): 1% of it is left
])
def test_the_slowdown_is_the_step_time_over_the_step_without_the_slowest_nodes_excess(own, slowest, slowdown):
    found = straggler.slowest(liveness_of([record(9, own)]))
    assert (found.node, found.slowdown) == (slowest, slowdown)


def test_one_node_alone_has_no_straggler():
    assert straggler.slowest(liveness_of([record(9, own=(0.3,))])) is None


def test_a_node_slow_for_the_window_gets_one_warning_and_status_names_it():
    body = job()
    slow = record(9, own=(0.02, 0.27, 0.02))
    first = step(body, 0, [slow])
    assert first.status["progress"]["slowestNode"] == "1" and first.status["progress"]["slowdown"] == 2.0
    assert not [e for e in first.events if e.reason == C.REASON_STRAGGLER]
    result = step(body, 31, [slow])
    event = next(e for e in result.events if e.reason == C.REASON_STRAGGLER)
    assert event.message == ("node 1 (pod mlp-node-1) has slowed the group 2.0x for 31s (spec.stragglerPolicy."
                             "threshold 1.5): its own time per step is 0.270s, the median node's 0.020s")
    assert not any(isinstance(a, DeletePod) for a in result.actions), "Report only reports"
    assert not [e for e in step(body, 60, [slow]).events if e.reason == C.REASON_STRAGGLER], "once per slow spell"
    step(body, 70, [record(9)])  # it caught up: the spell is over
    assert "slowSince" not in body["status"]["progress"]


def test_a_node_that_catches_up_within_the_window_is_not_reported():
    body = job()
    step(body, 0, [record(9, own=(0.02, 0.27, 0.02))])
    step(body, 20, [record(9)])
    result = step(body, 40, [record(9, own=(0.02, 0.27, 0.02))])
    assert not [e for e in result.events if e.reason == C.REASON_STRAGGLER]


def test_replace_deletes_the_straggler_and_lists_it_free_with_its_kubernetes_node():
    body = job(action="Replace")
    slow = record(9, own=(0.02, 0.02, 0.5))
    step(body, 0, [slow])
    result = step(body, 30, [slow])
    assert [a.name for a in result.actions if isinstance(a, DeletePod)] == ["mlp-node-2"]
    failure = result.status["failures"][-1]
    assert {k: failure[k] for k in ("cause", "pod", "node", "index")} == {
        "cause": "Straggler", "pod": "mlp-node-2", "node": "gpu-2", "index": 2}
    assert result.status["restarts"] == 0, "a replacement is not charged to the budget"
    replaced = [e for e in result.events if e.reason.startswith("Straggler")]
    assert [e.reason for e in replaced] == [C.REASON_STRAGGLER_REPLACED]
    assert replaced[0].message.endswith("; replacing its pod (not charged to the restart budget)")
    # Bad nodes stay bad (avoided_nodes.py): its replacement is kept off that Kubernetes node.
    assert [(n["node"], n["cause"]) for n in result.status["avoidedNodes"]] == [("gpu-2", "Straggler")]


def test_ignore_shows_the_slowest_node_but_never_warns():
    body = job(action="Ignore")
    slow = record(9, own=(0.02, 0.27, 0.02))
    step(body, 0, [slow])
    result = step(body, 300, [slow])
    assert result.status["progress"]["slowestNode"] == "1"
    assert not [e for e in result.events if e.reason.startswith("Straggler")]


def test_bad_straggler_and_hang_settings_are_refused_naming_field_value_and_rule():
    errors = validate_spec({"image": "x", "module": "m", "stragglerPolicy": {"action": "Kill", "threshold": 0.5},
                            "failurePolicy": {"hangTimeoutSeconds": -1, "collectiveTimeoutSeconds": 5}})
    assert [e.message for e in errors] == [
        "spec.failurePolicy.hangTimeoutSeconds (-1) must be >= 0",
        "spec.failurePolicy.collectiveTimeoutSeconds (5) must be >= 10",
        "spec.stragglerPolicy.action (\"Kill\") must be one of 'Ignore', 'Report' or 'Replace'",
        "spec.stragglerPolicy.threshold (0.5) must be >= 1.0",
    ]
