"""Progress-aware recovery with the real operator against the API emulator: the fake kubelet
reports termination messages carrying the trainer's progress record, as a real kubelet would."""
import datetime

from ddpjob_operator.api import constants as C
from ddpjob_sandbox.scripted import bind, set_disruption_target, set_node, set_running, set_terminated
from ddpjob_sandbox.readers import condition, events, pod_names, status
from ddpjob_sandbox.jobs import make_manifest
from ddpjob_sandbox.pod_status import progress_message

T0 = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)


def snapshot_time(step: int) -> str:
    """Snapshots are taken later the higher their step."""
    return (T0 + datetime.timedelta(seconds=step)).strftime("%Y-%m-%dT%H:%M:%SZ")


def uid(k8s, pod):
    found = k8s.find("pods", pod)
    return found and found["metadata"]["uid"]


def fail_and_wait_for_replacement(k8s, pod, step, error="RuntimeError: boom"):
    old = uid(k8s, pod)
    set_running(k8s, pod)
    set_terminated(k8s, pod, 1, message=progress_message(step, snapshot_time(step), error=error))
    k8s.wait_for(lambda: status(k8s).get("phase") == C.PHASE_FAILED or (uid(k8s, pod) not in (None, old)),
                 timeout=20, what=f"{pod} to be replaced (or the job to fail)")


def test_last_snapshot_reaches_status_and_a_progressing_job_survives_more_failures_than_max_restarts(k8s, operator):
    k8s.create("ddpjobs", make_manifest(replicas=2, failurePolicy={
        "maxRestarts": 1, "backoffSeconds": 1, "maxBackoffSeconds": 1}))
    k8s.wait_for(lambda: len(pod_names(k8s)) == 2, what="two node pods")
    set_running(k8s, "mlp-node-0")
    for n in range(1, 5):  # four failures, each after a newer snapshot
        fail_and_wait_for_replacement(k8s, "mlp-node-1", 100 * n)
        assert status(k8s)["phase"] != C.PHASE_FAILED, condition(k8s, C.COND_FAILED)
    final = status(k8s)
    assert final["restarts"] == 4 and final["restartsWithProgress"] == 4 and final["restartsWithoutProgress"] == 0
    assert final["lastSnapshot"] == {"epoch": 0, "step": 400, "time": snapshot_time(400),
                                     "path": "/snapshots/snapshot-s0000000400-e000000.pt"}
    assert [f["cause"] for f in final["failures"]] == ["Error"] * 4
    assert final["failures"][-1]["message"] == "RuntimeError: boom"


def test_a_crash_loop_at_the_same_step_fails_after_the_budget_with_a_reason(k8s, operator):
    k8s.create("ddpjobs", make_manifest(replicas=2, failurePolicy={
        "maxRestarts": 10, "maxRestartsWithoutProgress": 2, "backoffSeconds": 1, "maxBackoffSeconds": 1}))
    k8s.wait_for(lambda: len(pod_names(k8s)) == 2, what="two node pods")
    set_running(k8s, "mlp-node-0")
    for _ in range(4):  # the first is progress (a snapshot exists), then 3 in a row at step 120
        fail_and_wait_for_replacement(k8s, "mlp-node-1", 120, error="ValueError: NaN loss")
    k8s.wait_for(lambda: status(k8s).get("phase") == C.PHASE_FAILED, timeout=20, what="phase Failed")
    failed = condition(k8s, C.COND_FAILED)
    assert failed["reason"] == C.REASON_NO_PROGRESS
    assert failed["message"].startswith(
        "3 failure incidents in a row without a newer snapshot (still at step 120, epoch 0) exceed "
        "spec.failurePolicy.maxRestartsWithoutProgress (2); last: node pod mlp-node-1 (exit code 1, Error): "
        "ValueError: NaN loss")
    assert (status(k8s)["restarts"], status(k8s)["restartsWithoutProgress"]) == (4, 3)
    k8s.wait_for(lambda: ("Warning", C.REASON_NO_PROGRESS) in [(t, r) for t, r, _ in events(k8s)],
                 what="the NoProgress Event")


def test_a_disruption_target_does_not_consume_the_budget(k8s, operator):
    k8s.create("ddpjobs", make_manifest(replicas=2, failurePolicy={"maxRestarts": 0, "maxRestartsWithoutProgress": 0}))
    k8s.wait_for(lambda: len(pod_names(k8s)) == 2, what="two node pods")
    for n in range(2):
        old = uid(k8s, "mlp-node-1")
        set_running(k8s, "mlp-node-1")
        set_disruption_target(k8s, "mlp-node-1", reason="PreemptionByScheduler", message="preempted by team-a/big")
        k8s.wait_for(lambda: uid(k8s, "mlp-node-1") not in (None, old), timeout=20,
                     what="the preempted node to be replaced")
    final = status(k8s)
    assert final.get("restarts", 0) == 0 and final["phase"] != C.PHASE_FAILED
    assert [(f["cause"], f["reason"], f["message"]) for f in final["failures"]] == [
        ("Disrupted", "PreemptionByScheduler", "preempted by team-a/big")] * 2
    assert any(r == C.REASON_NODE_DISRUPTED for _, r, _ in events(k8s))


def test_a_pod_stuck_terminating_on_a_not_ready_node_is_force_deleted_and_replaced(cluster, k8s, operator):
    cluster.emulator.graceful_pod_deletion = True  # deletions wait for a kubelet that never answers
    k8s.create("ddpjobs", make_manifest(replicas=2, failurePolicy={
        "maxRestarts": 0, "forceDeleteTerminatingAfterSeconds": 1}))
    k8s.wait_for(lambda: len(pod_names(k8s)) == 2, what="two node pods")
    set_node(k8s, "gpu-a", ready=False)
    bind(k8s, "mlp-node-1", "gpu-a")
    set_running(k8s, "mlp-node-1")
    old = uid(k8s, "mlp-node-1")
    # The taint manager evicts the pod from the unreachable node: marked, never confirmed.
    set_disruption_target(k8s, "mlp-node-1", reason="DeletionByTaintManager",
                          message="Taint manager: deleting due to NoExecute taint", exit_code=None)
    k8s.delete("pods", "mlp-node-1", gracePeriodSeconds=1)
    assert k8s.find("pods", "mlp-node-1")["metadata"]["deletionTimestamp"]
    k8s.wait_for(lambda: uid(k8s, "mlp-node-1") not in (None, old), timeout=20,
                 what="the stuck pod force-deleted and replaced")
    forced = [m for _, r, m in events(k8s) if r == C.REASON_FORCE_DELETED]
    assert len(forced) == 1 and "on node gpu-a (NotReady)" in forced[0]
    final = status(k8s)
    assert final.get("restarts", 0) == 0 and final["phase"] != C.PHASE_FAILED
    assert [(f["cause"], f["reason"]) for f in final["failures"]] == [("NodeLost", "DeletionByTaintManager")]


def test_a_failed_job_stops_its_running_pods_but_never_touches_the_snapshot_claim(k8s, operator):
    claims = f"/api/v1/namespaces/{k8s.namespace}/persistentvolumeclaims"
    k8s.request("POST", claims, {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                                 "metadata": {"name": "mlp-snapshots"},
                                 "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}}})
    k8s.create("ddpjobs", make_manifest(replicas=2,
                                        snapshot={"volume": {"persistentVolumeClaim": {"claimName": "mlp-snapshots"}}},
                                        runPolicy={"ttlSecondsAfterFinished": 1}))  # cleanPodPolicy Running (default)
    k8s.wait_for(lambda: len(pod_names(k8s)) == 2, what="two node pods")
    set_running(k8s, "mlp-node-0")
    set_running(k8s, "mlp-node-1")
    set_terminated(k8s, "mlp-node-1", 127, message="torchrun: not found")  # permanent: fails the job
    k8s.wait_for(lambda: status(k8s).get("phase") == C.PHASE_FAILED, timeout=20, what="phase Failed")
    assert status(k8s)["failures"][0]["cause"] == "PermanentExitCode"
    k8s.wait_for(lambda: k8s.find("pods", "mlp-node-0") is None, timeout=20,
                 what="the still running node pod deleted (quota released)")
    k8s.wait_for(lambda: k8s.find("ddpjobs", "mlp") is None, timeout=20, what="the TTL to delete the job")
    k8s.wait_for(lambda: pod_names(k8s) == [], timeout=20, what="the garbage collector to remove the failed pod")
    claim = k8s.request("GET", f"{claims}/mlp-snapshots")
    assert claim["metadata"]["name"] == "mlp-snapshots" and not claim["metadata"].get("deletionTimestamp")
