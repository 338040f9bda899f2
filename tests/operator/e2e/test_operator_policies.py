"""Run and failure policies that act later, without a new event: the operator's requeue
timers (deadline, TTL, backoff), the restart budget, disruptions, externally deleted pods and
a spec that is fixed after being rejected. Real operator against the API emulator."""
import time

from ddpjob_operator.api import constants as C
from ddpjob_sandbox.readers import condition, pod_names, status
from ddpjob_sandbox.jobs import make_manifest
from ddpjob_sandbox.pod_status import now_rfc3339
from ddpjob_sandbox.scripted import set_running, set_terminated


def test_active_deadline_fails_the_job_without_any_further_event(k8s, operator):
    k8s.create("ddpjobs", make_manifest(replicas=1, runPolicy={"activeDeadlineSeconds": 1}))
    k8s.wait_for(lambda: pod_names(k8s) == ["mlp-node-0"], what="the node pod")
    set_running(k8s, "mlp-node-0")
    k8s.wait_for(lambda: status(k8s).get("phase") == C.PHASE_FAILED, timeout=20,
                 what="the deadline to fail the job (a requeue timer, nothing else changes)")
    assert condition(k8s, C.COND_FAILED)["reason"] == C.REASON_DEADLINE
    k8s.wait_for(lambda: pod_names(k8s) == [], timeout=15, what="the running pod to be cleaned up")


def test_ttl_after_finished_deletes_the_job_and_by_ownership_its_pods(k8s, operator):
    k8s.create("ddpjobs", make_manifest(replicas=1, runPolicy={"ttlSecondsAfterFinished": 1, "cleanPodPolicy": "None"}))
    k8s.wait_for(lambda: pod_names(k8s) == ["mlp-node-0"], what="the node pod")
    set_terminated(k8s, "mlp-node-0", 0)
    k8s.wait_for(lambda: status(k8s).get("phase") == C.PHASE_SUCCEEDED, what="phase Succeeded")
    k8s.wait_for(lambda: k8s.find("ddpjobs", "mlp") is None, timeout=20, what="the TTL to delete the job")
    k8s.wait_for(lambda: pod_names(k8s) == [] and not k8s.list("services"), timeout=15,
                 what="the garbage collector to remove the pods and Service")


def test_a_spent_restart_budget_fails_the_job(k8s, operator):
    k8s.create("ddpjobs", make_manifest(replicas=2, failurePolicy={"maxRestarts": 0}))
    k8s.wait_for(lambda: len(pod_names(k8s)) == 2, what="two node pods")
    set_terminated(k8s, "mlp-node-1", 1)
    k8s.wait_for(lambda: status(k8s).get("phase") == C.PHASE_FAILED, timeout=20, what="phase Failed")
    assert condition(k8s, C.COND_FAILED)["reason"] == C.REASON_RESTARTS_EXHAUSTED


def test_a_disrupted_node_is_replaced_without_spending_the_budget(k8s, operator):
    k8s.create("ddpjobs", make_manifest(replicas=2, failurePolicy={"maxRestarts": 0}))
    k8s.wait_for(lambda: len(pod_names(k8s)) == 2, what="two node pods")
    old_uid = k8s.get("pods", "mlp-node-1")["metadata"]["uid"]
    k8s.patch("pods", "mlp-node-1", {"status": {"phase": "Failed", "reason": "Evicted", "conditions": [
        {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
         "lastTransitionTime": now_rfc3339()}],
        "containerStatuses": [{"name": C.CONTAINER_NAME, "state": {"terminated": {
            "exitCode": 137, "reason": "Error", "finishedAt": now_rfc3339()}}}]}}, subresource="status")
    k8s.wait_for(lambda: (p := k8s.find("pods", "mlp-node-1")) and p["metadata"]["uid"] != old_uid, timeout=20,
                 what="the evicted node to be replaced")
    assert status(k8s).get("restarts", 0) == 0
    assert status(k8s)["phase"] != C.PHASE_FAILED


def test_a_node_pod_deleted_by_someone_else_is_created_again(k8s, operator):
    k8s.create("ddpjobs", make_manifest(replicas=2))
    k8s.wait_for(lambda: len(pod_names(k8s)) == 2, what="two node pods")
    old_uid = k8s.get("pods", "mlp-node-0")["metadata"]["uid"]
    k8s.delete("pods", "mlp-node-0")
    k8s.wait_for(lambda: (p := k8s.find("pods", "mlp-node-0")) and p["metadata"]["uid"] != old_uid, timeout=20,
                 what="mlp-node-0 to be created again")


def test_fixing_an_invalid_spec_starts_the_job(k8s, operator):
    body = make_manifest(replicas=2)
    body["spec"]["elasticPolicy"] = {"rdzvBackend": "etcd"}  # etcd without endpoints: invalid
    k8s.create("ddpjobs", body)
    k8s.wait_for(lambda: condition(k8s, C.COND_INVALID_SPEC), what="InvalidSpec")
    assert "rdzvEndpoints" in condition(k8s, C.COND_INVALID_SPEC)["message"]
    time.sleep(0.3)
    assert pod_names(k8s) == []
    k8s.patch("ddpjobs", "mlp", {"spec": {"elasticPolicy": {"rdzvEndpoints": ["etcd:2379"]}}})
    k8s.wait_for(lambda: len(pod_names(k8s)) == 2, timeout=20, what="pods once the spec is valid")
    k8s.wait_for(lambda: (condition(k8s, C.COND_INVALID_SPEC) or {}).get("status") != "True", timeout=15,
                 what="InvalidSpec to be cleared")


def test_an_invalid_edit_of_a_running_job_still_replaces_its_failed_pods(k8s, operator):
    k8s.create("ddpjobs", make_manifest(replicas=2))
    k8s.wait_for(lambda: len(pod_names(k8s)) == 2, what="two node pods")
    for pod in pod_names(k8s):
        set_running(k8s, pod)
    k8s.wait_for(lambda: status(k8s).get("phase") == C.PHASE_RUNNING, what="phase Running")
    assert status(k8s)["lastValid"]["generation"] == 1
    k8s.patch("ddpjobs", "mlp", {"spec": {"elasticPolicy": {"rdzvBackend": "etcd"}}})  # invalid: no endpoints
    k8s.wait_for(lambda: (condition(k8s, C.COND_INVALID_SPEC) or {}).get("status") == "True", what="InvalidSpec")
    assert "last valid spec (generation 1)" in condition(k8s, C.COND_INVALID_SPEC)["message"]
    old_uid = k8s.get("pods", "mlp-node-1")["metadata"]["uid"]
    set_terminated(k8s, "mlp-node-1", 1)
    k8s.wait_for(lambda: (p := k8s.find("pods", "mlp-node-1")) and p["metadata"]["uid"] != old_uid, timeout=20,
                 what="the failed node to be replaced from the last valid spec")
    assert status(k8s)["phase"] == C.PHASE_RESTARTING and status(k8s)["restarts"] == 1
