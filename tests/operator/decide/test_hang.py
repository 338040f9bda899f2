"""Hang detection, pure (decide/hang.py): a job whose pods run but whose step stands still for the
hang timeout restarts the whole group as one incident, named in an Event and status.failures."""

from __future__ import annotations

import pytest

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.clock import format_time
from ddpjob_operator.api.validation import parse_spec
from ddpjob_operator.decide import hang
from ddpjob_operator.decide.actions import DeletePod
from ddpjob_operator.decide.observed import NodeBeat, liveness_of
from ddpjob_operator.decide.reconcile import reconcile
from ddpjob_sandbox.jobs import make_ddpjob
from tests.operator.builders import at, observe
from tests.operator.topology_builders import ETCD_V3, gen_pod

RUN = format_time(at(-100))  # when the polled node's workers started


def record(step, *, run=RUN, phases=("collective", "collective", "collective"), beats=(0, 0, 0), step_seconds=0.5,
           fatal=None):
    nodes = [{"node": str(i), "step": step, "phase": phase, "heartbeat": format_time(at(beat)),
              "stepSeconds": step_seconds, "dataSeconds": 0.01, "computeSeconds": 0.05}
             for i, (phase, beat) in enumerate(zip(phases, beats))]
    found = {"kind": C.PROGRESS_RECORD_KIND, "version": 1, "node": "0", "resume": {"time": run}, "nodes": nodes}
    return {**found, "fatal": fatal} if fatal else found


def job(**failure_policy):
    body = make_ddpjob(replicas=3, **ETCD_V3, failurePolicy={"backoffSeconds": 0, **failure_policy})
    body["status"] = {"phase": C.PHASE_RUNNING}
    return body


def running(body, generation=0):
    pods = [gen_pod(body, i, generation) for i in range(3)]
    for i, pod in enumerate(pods):
        pod["spec"]["nodeName"] = f"gpu-{i}"
    return pods


def step(body, seconds, live, pods=None):
    result = reconcile(body, observe(pods if pods is not None else running(body), live_progress=live), at(seconds))
    body["status"] = result.status
    return result


def test_a_step_that_stands_still_for_the_timeout_restarts_the_group_as_one_hang_incident():
    body = job(hangTimeoutSeconds=60)
    step(body, 0, [record(40)])
    assert body["status"]["progress"]["advancedTime"] == format_time(at(0))
    quiet = step(body, 59, [record(40)])
    assert not any(isinstance(a, DeletePod) for a in quiet.actions) and body["status"]["phase"] == C.PHASE_RUNNING

    result = step(body, 61, [record(40, phases=("collective", "local", "collective"))])

    status = result.status
    assert status["phase"] == C.PHASE_RESTARTING and status["rendezvousGeneration"] == 1 and status["restarts"] == 1
    assert sorted(a.name for a in result.actions if isinstance(a, DeletePod)) == ["mlp-node-0", "mlp-node-1",
                                                                                  "mlp-node-2"]
    failure = status["failures"][-1]
    assert {k: failure[k] for k in ("cause", "step", "stalledNodes", "pod", "node", "message")} == {
        "cause": "Hang", "step": 40, "stalledNodes": ["1"], "pod": "mlp-node-1", "node": "gpu-1",
        "message": "no training step for 61s (hang timeout 60s)"}
    event = next(e for e in result.events if e.reason == C.REASON_HANG)
    assert event.message.startswith("no training step for 61s (hang timeout 60s, "
                                    "spec.failurePolicy.hangTimeoutSeconds): stuck at step 40, progress stopped "
                                    "on node(s) 1; restarting all node pods from the last snapshot")
    assert "advancedTime" not in status["progress"], "the new run starts the hang clock afresh"


def test_a_step_that_advances_keeps_the_clock_running_from_the_advance():
    body = job(hangTimeoutSeconds=60)
    step(body, 0, [record(40)])
    step(body, 50, [record(41)])
    result = step(body, 100, [record(41)])
    assert result.status["phase"] == C.PHASE_RUNNING
    assert result.status["progress"]["advancedTime"] == format_time(at(50))


def test_a_new_run_at_the_same_step_restarts_the_clock():
    body = job(hangTimeoutSeconds=60)
    step(body, 0, [record(40)])
    result = step(body, 70, [record(40, run=format_time(at(65)))])  # torchrun restarted the workers
    assert result.status["phase"] == C.PHASE_RUNNING
    assert result.status["progress"]["advancedTime"] == format_time(at(70))


def test_no_hang_is_declared_by_a_pass_that_read_no_record():
    body = job(hangTimeoutSeconds=60)
    step(body, 0, [record(40)])
    assert step(body, 500, []).status["phase"] == C.PHASE_RUNNING


def test_no_hang_while_a_node_pod_is_not_running():
    body = job(hangTimeoutSeconds=60)
    step(body, 0, [record(40)])
    pods = running(body)
    pods[2] = gen_pod(body, 2, 0, phase="Pending")
    assert step(body, 100, [record(40)], pods).status.get("rendezvousGeneration") is None


def test_zero_turns_hang_detection_off():
    body = job(hangTimeoutSeconds=0)
    step(body, 0, [record(40)])
    assert step(body, 100000, [record(40)]).status["phase"] == C.PHASE_RUNNING


def test_the_clock_waits_for_the_runs_first_step():
    body = job(hangTimeoutSeconds=60)
    started = record(40)
    for node in started["nodes"]:
        node.pop("stepSeconds")
    step(body, 0, [started])
    assert "advancedTime" not in step(body, 500, [started]).status["progress"]


@pytest.mark.parametrize(("explicit", "step_seconds", "timeout"), [
    (None, None, 600.0), (None, 0.5, 600.0), (None, 60.0, 1200.0), (45, 60.0, 45.0), (0, 1.0, 0.0)])
def test_the_timeout_is_the_specs_else_derived_from_the_step_time_with_a_floor(explicit, step_seconds, timeout):
    policy = parse_spec({"image": "x", "module": "m", "failurePolicy": {"hangTimeoutSeconds": explicit}}).failure_policy
    assert hang.hang_timeout(policy, step_seconds) == timeout


def beats(*nodes):
    return liveness_of([{"nodes": list(nodes)}]).nodes


def node(name, phase="collective", beat=0):
    return {"node": name, "step": 7, "phase": phase, "heartbeat": format_time(at(beat))}


@pytest.mark.parametrize(("nodes", "stalled"), [
    ((node("0"), node("1", beat=-30), node("2")), ("1",)),  # stopped beating: a frozen process or host
    ((node("0"), node("1", "local"), node("2")), ("1",)),  # outside the collective the others wait in
    ((node("0", "local"), node("1", "local")), ("0", "1")),  # every node stuck in its own code
    ((node("0"), node("1")), ("0", "1")),  # every node in a collective
])
def test_the_stalled_nodes_are_those_the_others_wait_for(nodes, stalled):
    assert hang.stalled_nodes(beats(*nodes)) == stalled


def test_a_live_do_not_retry_fails_the_job_at_once_with_its_reason():
    body = job()
    result = step(body, 0, [record(40, fatal={"reason": "NanLoss", "message": "the loss is NaN"})])
    assert result.status["phase"] == C.PHASE_FAILED
    failed = next(c for c in result.status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "NanLoss"
    assert failed["message"] == "node 0: the loss is NaN; its trainer raised DoNotRetry (NanLoss): not retried"


def test_hangs_in_a_row_without_a_newer_snapshot_fail_the_job_naming_the_hang():
    body = job(hangTimeoutSeconds=60, maxRestartsWithoutProgress=0)
    body["status"]["lastSnapshot"] = {"epoch": 0, "step": 30, "time": format_time(at(-500)), "path": "/s/30"}
    body["status"]["recovery"] = {"accountedRestarts": 0, "snapshotAtLastFailure": {"step": 30, "time": format_time(
        at(-500))}}
    step(body, 0, [record(40)])
    result = step(body, 61, [record(40)])
    assert result.status["phase"] == C.PHASE_FAILED
    failed = next(c for c in result.status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == C.REASON_NO_PROGRESS
    assert failed["message"].endswith("last: node pod mlp-node-0 (Hang): no training step for 61s (hang timeout 60s)")


def test_reading_another_node_of_the_same_run_does_not_restart_the_clock():
    body = job(hangTimeoutSeconds=60)
    step(body, 0, [record(40, run=format_time(at(-100)))])
    step(body, 30, [record(40, run=format_time(at(-102)))])  # node 0 did not answer: node 1, started earlier
    result = step(body, 61, [record(40, run=format_time(at(-100)))])
    assert result.status["phase"] == C.PHASE_RESTARTING and result.status["rendezvousGeneration"] == 1


def test_a_live_do_not_retry_is_reported_by_one_event():
    result = step(job(), 0, [record(40, fatal={"reason": "NanLoss", "message": "the loss is NaN"})])
    assert [e.reason for e in result.events].count("NanLoss") == 1
