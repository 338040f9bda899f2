"""Bad nodes stay bad: status.avoidedNodes and the replacement pod's anti-affinity (pure, fixed clock).

The sandbox does not schedule, so the proof is the rendered replacement pod: its required
node affinity has kubernetes.io/hostname NotIn the avoided nodes.
"""
from __future__ import annotations

from ddpjob_operator.api.clock import format_time
from ddpjob_operator.api.status import DDPJobStatus
from ddpjob_operator.decide import avoided_nodes
from ddpjob_operator.decide.actions import CreatePod
from ddpjob_operator.decide.reconcile import reconcile
from ddpjob_sandbox.jobs import make_ddpjob
from tests.operator.builders import at, make_pod, observe
from tests.operator.topology_builders import with_store


def failure(uid: str, node: str, cause: str, seconds: float, index: int = 1) -> dict:
    return {"index": index, "pod": f"mlp-node-{index}", "podUID": uid, "node": node, "cause": cause,
            "time": format_time(at(seconds))}


def added(previous: list, failures: list, avoided=None) -> list | None:
    return avoided_nodes.updated(previous, failures, avoided)[0]


def test_a_node_lost_or_straggling_node_is_avoided_at_once_with_its_cause_and_time():
    new = [failure("a", "gpu-a", "NodeLost", 10), failure("b", "gpu-b", "Straggler", 20, 0)]
    result, events = avoided_nodes.updated([], new, None)
    assert result == [{"node": "gpu-a", "cause": "NodeLost", "since": format_time(at(10))},
                      {"node": "gpu-b", "cause": "Straggler", "since": format_time(at(20))}]
    assert [e.message for e in events] == [
        "node gpu-a is avoided for the rest of the job (NodeLost): replacement pods carry a required "
        "anti-affinity to it",
        "node gpu-b is avoided for the rest of the job (Straggler): replacement pods carry a required "
        "anti-affinity to it"]


def test_an_eviction_says_nothing_about_the_node_and_a_pod_never_scheduled_has_no_node():
    assert added([], [failure("a", "gpu-a", "Disrupted", 10), {**failure("b", "", "NodeLost", 10)}]) is None


def test_a_node_whose_pods_failed_alone_twice_is_avoided_but_one_failure_is_not_enough():
    first = [failure("a", "gpu-a", "Error", 0)]
    assert added([], first) is None
    second = first + [failure("b", "gpu-a", "OOMKilled", 600)]
    assert added(first, second) == [{"node": "gpu-a", "cause": "RepeatedFailures", "since": format_time(at(600))}]


def test_failures_on_every_node_at_once_are_the_codes_fault_and_avoid_no_node():
    crash = [failure("a", "gpu-a", "Error", 0, 0), failure("b", "gpu-b", "Error", 5, 1),
             failure("c", "gpu-a", "Error", 600, 0), failure("d", "gpu-b", "Error", 630, 1)]
    assert added(crash[:2], crash) is None


def test_the_list_is_bounded_oldest_first_and_a_dropped_node_is_not_added_straight_back():
    old = [{"node": f"n{i}", "cause": "NodeLost", "since": format_time(at(i))} for i in range(16)]
    failures = [failure("x", "n-new", "NodeLost", 100)]
    result = added([], failures, old)
    assert len(result) == 16 and result[0]["node"] == "n1" and result[-1]["node"] == "n-new"
    assert added(failures, failures + [failure("y", "n-other", "Disrupted", 200)], result) == result
    assert added([], [failure("z", "n3", "NodeLost", 300)], result) == result  # listed already: kept as it was


def lost(job: dict, index: int, node: str) -> dict:
    """Node pod `index` lost with its node: Failed under a DisruptionTarget the taint manager set."""
    pod = make_pod(job, index, phase="Failed", exit_code=137)
    pod["spec"]["nodeName"] = node
    pod["status"]["conditions"].append({"type": "DisruptionTarget", "status": "True",
                                        "reason": "DeletionByTaintManager", "message": "node gpu-bad is gone"})
    return pod


def test_the_replacement_of_a_pod_lost_with_its_node_is_rendered_off_that_node():
    job = make_ddpjob(replicas=2)
    healthy = make_pod(job, 0)
    first = reconcile(job, observe(with_store(job, [healthy, lost(job, 1, "gpu-bad")])), at(10))
    assert first.status["failures"][-1]["node"] == "gpu-bad"
    assert first.status["avoidedNodes"] == [{"node": "gpu-bad", "cause": "NodeLost", "since": format_time(at(0))}]
    assert "NodeAvoided" in [e.reason for e in first.events]
    DDPJobStatus.model_validate(first.status)  # the CRD's status schema keeps both fields (nothing pruned)
    job["status"] = first.status
    second = reconcile(job, observe(with_store(job, [healthy])), at(12))  # the lost pod is gone
    [replacement] = [a.body for a in second.actions if isinstance(a, CreatePod)]
    assert replacement["metadata"]["name"] == "mlp-node-1"
    terms = replacement["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms == {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["gpu-bad"]}]}]}
    assert second.status["avoidedNodes"] == first.status["avoidedNodes"]  # for the rest of the job
    assert [e.reason for e in second.events if e.reason == "NodeAvoided"] == []  # reported once


def failed_preflight(job: dict, index: int, node: str) -> dict:
    """Node pod `index` whose pre-flight init container failed on `node` (the trainer never started)."""
    pod = make_pod(job, index, phase="Pending")
    pod["spec"]["nodeName"] = node
    pod["status"] = {"phase": "Failed", "initContainerStatuses": [{"name": "preflight", "state": {"terminated": {
        "exitCode": 86, "finishedAt": format_time(at(5)),
        "message": "preflight failed: 0 GPU(s) visible as /dev/nvidiaN, 1 expected"}}}],
        "containerStatuses": [{"name": "trainer", "state": {"waiting": {"reason": "PodInitializing"}}}]}
    return pod


def test_a_failed_preflight_is_listed_with_its_message_and_its_node_avoided_when_it_failed_alone():
    # Its message is a log tail: shown because the job opts in (test_log_tail.py: hidden otherwise).
    job = make_ddpjob(replicas=2, preflight={"enabled": True}, failurePolicy={"includeLogTail": True})
    result = reconcile(job, observe(with_store(job, [make_pod(job, 0), failed_preflight(job, 1, "gpu-x")])), at(10))
    failure = result.status["failures"][-1]
    assert {k: failure[k] for k in ("node", "cause", "message")} == {
        "node": "gpu-x", "cause": "PreflightFailed",
        "message": "preflight failed: 0 GPU(s) visible as /dev/nvidiaN, 1 expected"}
    assert result.status["restarts"] == 1  # it counts against the budget: a job failing it everywhere must stop
    assert avoided_nodes.names(result.status) == ["gpu-x"]


def test_a_preflight_failing_on_every_node_at_once_is_the_jobs_configuration_and_avoids_nothing():
    job = make_ddpjob(replicas=2, preflight={"enabled": True})
    pods = [failed_preflight(job, 0, "gpu-x"), failed_preflight(job, 1, "gpu-y")]
    result = reconcile(job, observe(with_store(job, pods)), at(10))
    assert [f["cause"] for f in result.status["failures"]] == ["PreflightFailed", "PreflightFailed"]
    assert "avoidedNodes" not in result.status
