"""Progress-aware recovery with the helm-installed operator on the real control plane: the test
writes the pods' status as a kubelet would, termination messages carrying the trainer's progress
record included."""
import datetime

import pytest

from ddpjob_operator.api import constants as C
from ddpjob_sandbox.control_plane.cluster import volume_body
from ddpjob_sandbox.control_plane.scripted_nodes import Reaper, StatusOnlyNode
from ddpjob_sandbox.pod_status import progress_message
from ddpjob_sandbox.readers import condition, events, pod_names, status
from ddpjob_sandbox.scripted import set_disruption_target, set_node, set_running, set_terminated
from tests.cluster.conftest import HEARTBEAT_SECONDS
from tests.cluster.operators import clean, status_manifest

pytestmark = pytest.mark.cluster

T0 = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)


def snapshot_time(step: int) -> str:
    """Snapshots are taken later the higher their step."""
    return (T0 + datetime.timedelta(seconds=step)).strftime("%Y-%m-%dT%H:%M:%SZ")


def uid(kube, pod):
    found = kube.find("pods", pod)
    return found and found["metadata"]["uid"]


def placed(kube, pod) -> bool:
    """The scheduler bound ``pod`` (a kubelet reports a pod's status only once it is on its Node)."""
    found = kube.find("pods", pod)
    return bool(found and found["spec"].get("nodeName"))


def wait_pods_placed(kube, job, count=2):
    kube.wait_for(lambda: len(names := pod_names(kube, job)) == count and all(placed(kube, p) for p in names),
                  timeout=20, what=f"{count} node pods placed")


def fail_and_wait_for_replacement(kube, job, pod, step, error="RuntimeError: boom"):
    old = uid(kube, pod)
    kube.wait_for(lambda: placed(kube, pod), timeout=20, what=f"{pod} placed")
    set_running(kube, pod)
    set_terminated(kube, pod, 1, message=progress_message(step, snapshot_time(step), error=error))
    kube.wait_for(lambda: status(kube, job).get("phase") == C.PHASE_FAILED or (uid(kube, pod) not in (None, old)),
                  timeout=20, what=f"{pod} to be replaced (or the job to fail)")


def test_last_snapshot_reaches_status_and_a_progressing_job_survives_more_failures_than_max_restarts(operator):
    kube, job = operator.kube, operator.job
    kube.create("ddpjobs", status_manifest(job, replicas=2, failurePolicy={
        "maxRestarts": 1, "backoffSeconds": 1, "maxBackoffSeconds": 1}))
    wait_pods_placed(kube, job)
    set_running(kube, f"{job}-node-0")
    for n in range(1, 5):  # four failures, each after a newer snapshot
        fail_and_wait_for_replacement(kube, job, f"{job}-node-1", 100 * n)
        assert status(kube, job)["phase"] != C.PHASE_FAILED, condition(kube, C.COND_FAILED, job)
    final = status(kube, job)
    assert final["restarts"] == 4 and final["restartsWithProgress"] == 4 and final["restartsWithoutProgress"] == 0
    assert final["lastSnapshot"] == {"epoch": 0, "step": 400, "time": snapshot_time(400),
                                     "path": "/snapshots/snapshot-s0000000400-e000000.pt"}
    assert [f["cause"] for f in final["failures"]] == ["Error"] * 4
    assert final["failures"][-1]["message"] == "RuntimeError: boom"


def test_a_crash_loop_at_the_same_step_fails_after_the_budget_with_a_reason(operator):
    kube, job = operator.kube, operator.job
    kube.create("ddpjobs", status_manifest(job, replicas=2, failurePolicy={
        "maxRestarts": 10, "maxRestartsWithoutProgress": 2, "backoffSeconds": 1, "maxBackoffSeconds": 1}))
    wait_pods_placed(kube, job)
    set_running(kube, f"{job}-node-0")
    for _ in range(4):  # the first is progress (a snapshot exists), then 3 in a row at step 120
        fail_and_wait_for_replacement(kube, job, f"{job}-node-1", 120, error="ValueError: NaN loss")
    kube.wait_for(lambda: status(kube, job).get("phase") == C.PHASE_FAILED, timeout=20, what="phase Failed")
    failed = condition(kube, C.COND_FAILED, job)
    assert failed["reason"] == C.REASON_NO_PROGRESS
    assert failed["message"].startswith(
        "3 failure incidents in a row without a newer snapshot (still at step 120, epoch 0) exceed "
        f"spec.failurePolicy.maxRestartsWithoutProgress (2); last: node pod {job}-node-1 (exit code 1, Error): "
        "ValueError: NaN loss")
    assert (status(kube, job)["restarts"], status(kube, job)["restartsWithoutProgress"]) == (4, 3)
    kube.wait_for(lambda: ("Warning", C.REASON_NO_PROGRESS) in [(t, r) for t, r, _ in events(kube, job)],
                  what="the NoProgress Event")


def test_a_disruption_target_does_not_consume_the_budget(operator):
    kube, job = operator.kube, operator.job
    pod = f"{job}-node-1"
    kube.create("ddpjobs", status_manifest(job, replicas=2, failurePolicy={"maxRestarts": 0, "maxRestartsWithoutProgress": 0}))
    wait_pods_placed(kube, job)
    for n in range(2):
        old = uid(kube, pod)
        kube.wait_for(lambda: placed(kube, pod), timeout=20, what=f"{pod} placed")
        set_running(kube, pod)
        set_disruption_target(kube, pod, reason="PreemptionByScheduler", message="preempted by team-a/big")
        kube.wait_for(lambda: uid(kube, pod) not in (None, old), timeout=20,
                      what="the preempted node to be replaced")
    final = status(kube, job)
    assert final.get("restarts", 0) == 0 and final["phase"] != C.PHASE_FAILED
    assert [(f["cause"], f["reason"], f["message"]) for f in final["failures"]] == [
        ("Disrupted", "PreemptionByScheduler", "preempted by team-a/big")] * 2
    assert any(r == C.REASON_NODE_DISRUPTED for _, r, _ in events(kube, job))


@pytest.fixture
def silent_node(control_plane, operator):
    """A status-only Node of this test's own whose pods nobody removes while the test runs: a
    pod deleted there stays Terminating, as on a Node whose kubelet stopped answering. After the
    test the job is cleaned with a Reaper removing that Node's deleted pods, then the Node goes."""
    admin = control_plane.client()
    node = StatusOnlyNode(f"{operator.job}-gpu-a", admin, heartbeat_seconds=HEARTBEAT_SECONDS)
    node.start()
    try:
        yield node
    finally:
        node.stop()
        # This fixture ends before `operator`'s clean-up, which would wait on pods nobody removes.
        reaper = Reaper(admin, [node.name]).start()
        try:
            clean(operator)
        finally:
            reaper.stop()
            admin.delete("nodes", node.name)


def test_a_pod_stuck_terminating_on_a_not_ready_node_is_force_deleted_and_replaced(operator, silent_node):
    kube, job = operator.kube, operator.job
    pod = f"{job}-node-1"
    body = status_manifest(job, replicas=2, failurePolicy={"maxRestarts": 0, "forceDeleteTerminatingAfterSeconds": 1})
    # Both node pods on this test's Node: the scheduler places them (a pod is bound once).
    body["spec"]["scheduling"]["nodeSelector"]["kubernetes.io/hostname"] = silent_node.name
    kube.create("ddpjobs", body)
    wait_pods_placed(kube, job)
    set_running(kube, pod)
    old = uid(kube, pod)
    silent_node.stop()  # its kubelet stops answering: no heartbeat, and the node controller's view
    set_node(kube, silent_node.name, ready=False)  # (the node controller marks it Unknown 16 s later)
    # The taint manager evicts the pod from the unreachable node: marked, never confirmed.
    set_disruption_target(kube, pod, reason="DeletionByTaintManager",
                          message="Taint manager: deleting due to NoExecute taint", exit_code=None)
    kube.delete("pods", pod, gracePeriodSeconds=1)
    assert kube.find("pods", pod)["metadata"]["deletionTimestamp"]
    kube.wait_for(lambda: uid(kube, pod) not in (None, old), timeout=20,
                  what="the stuck pod force-deleted and replaced")
    forced = [m for _, r, m in events(kube, job) if r == C.REASON_FORCE_DELETED]
    assert len(forced) == 1 and f"on node {silent_node.name} (NotReady)" in forced[0]
    final = status(kube, job)
    assert final.get("restarts", 0) == 0 and final["phase"] != C.PHASE_FAILED
    assert [(f["cause"], f["reason"]) for f in final["failures"]] == [("NodeLost", "DeletionByTaintManager")]


def test_a_failed_job_stops_its_running_pods_but_never_touches_the_snapshot_claim(operator, control_plane, tmp_path):
    kube, job = operator.kube, operator.job
    admin, claim_name, volume = control_plane.client(), f"{job}-snapshots", f"{job}-pv"
    # A volume of the test's own, bound to its claim by name: the pods are placed only once their
    # claim is bound, and the shared volumes of the tier stay for the tests that fill them.
    admin.create("persistentvolumes", volume_body(volume, tmp_path / "snapshots"))
    claims = f"/api/v1/namespaces/{kube.namespace}/persistentvolumeclaims"
    kube.request("POST", claims, {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                                  "metadata": {"name": claim_name},
                                  "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": volume,
                                           "resources": {"requests": {"storage": "1Gi"}}}})
    try:
        kube.create("ddpjobs", status_manifest(
            job, replicas=2, snapshot={"volume": {"persistentVolumeClaim": {"claimName": claim_name}}},
            runPolicy={"ttlSecondsAfterFinished": 1}))  # cleanPodPolicy Running (default)
        wait_pods_placed(kube, job)
        set_running(kube, f"{job}-node-0")
        set_running(kube, f"{job}-node-1")
        set_terminated(kube, f"{job}-node-1", 127, message="torchrun: not found")  # permanent: fails the job
        kube.wait_for(lambda: status(kube, job).get("phase") == C.PHASE_FAILED, timeout=20, what="phase Failed")
        assert status(kube, job)["failures"][0]["cause"] == "PermanentExitCode"
        kube.wait_for(lambda: kube.find("pods", f"{job}-node-0") is None, timeout=20,
                      what="the still running node pod deleted (quota released)")
        kube.wait_for(lambda: kube.find("ddpjobs", job) is None, timeout=20, what="the TTL to delete the job")
        kube.wait_for(lambda: pod_names(kube, job) == [], timeout=20, what="the garbage collector to remove the failed pod")
        claim = kube.request("GET", f"{claims}/{claim_name}")
        assert claim["metadata"]["name"] == claim_name and not claim["metadata"].get("deletionTimestamp")
        assert claim["status"]["phase"] == "Bound"
    finally:
        kube.request("DELETE", f"{claims}/{claim_name}")
        admin.delete("persistentvolumes", volume)
