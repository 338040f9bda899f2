"""Run and failure policies that act later, without a new event: the operator's requeue
timers (deadline, TTL, backoff), the restart budget, disruptions, externally deleted pods and
a spec that is fixed after being rejected. The helm-installed operator on the real control
plane: a deleted job's pods and Service go through the real garbage collector."""
import pytest

from ddpjob_operator.api import constants as C
from ddpjob_operator.render.common import job_selector
from ddpjob_sandbox.pod_status import now_rfc3339
from ddpjob_sandbox.readers import condition, pod_names, status, wait_for_event
from ddpjob_sandbox.scripted import set_running, set_terminated
from tests.cluster.operators import status_manifest

pytestmark = pytest.mark.cluster

# A pod label key the CRD lets through and the operator refuses (corpus label-key-with-a-space.yaml).
# An etcd backend without endpoints, which this test used against the emulator, the real API
# server refuses at create and at update (the CRD's rule): the operator never sees it.
BAD_LABELS = {"podOverrides": {"labels": {"team name": "a"}}}


def test_active_deadline_fails_the_job_without_any_further_event(operator):
    kube, job = operator.kube, operator.job
    # Its pod stays Pending on a status-only Node: after the pass that creates it, nothing changes.
    # (Waiting for the pod to set it running raced the 1 s deadline on a loaded machine: the job
    # could fail and its pod go before the test saw it.)
    kube.create("ddpjobs", status_manifest(job, replicas=1, runPolicy={"activeDeadlineSeconds": 1}))
    kube.wait_for(lambda: status(kube, job).get("phase") == C.PHASE_FAILED, timeout=20,
                  what="the deadline to fail the job (a requeue timer, nothing else changes)")
    assert condition(kube, C.COND_FAILED, job)["reason"] == C.REASON_DEADLINE
    kube.wait_for(lambda: pod_names(kube, job) == [], timeout=15, what="the pod to be cleaned up")


def test_ttl_after_finished_deletes_the_job_and_by_ownership_its_pods(operator):
    kube, job = operator.kube, operator.job
    kube.create("ddpjobs", status_manifest(job, replicas=1,
                                           runPolicy={"ttlSecondsAfterFinished": 1, "cleanPodPolicy": "None"}))
    kube.wait_for(lambda: pod_names(kube, job) == [f"{job}-node-0"], what="the node pod")
    set_terminated(kube, f"{job}-node-0", 0)
    kube.wait_for(lambda: status(kube, job).get("phase") == C.PHASE_SUCCEEDED, what="phase Succeeded")
    kube.wait_for(lambda: kube.find("ddpjobs", job) is None, timeout=20, what="the TTL to delete the job")
    kube.wait_for(lambda: not kube.list("pods", label_selector=job_selector(job))
                  and not kube.list("services", label_selector=job_selector(job)), timeout=60,
                  what="the garbage collector to remove the pods and Services")


def test_a_spent_restart_budget_fails_the_job(operator):
    kube, job = operator.kube, operator.job
    kube.create("ddpjobs", status_manifest(job, replicas=2, failurePolicy={"maxRestarts": 0}))
    kube.wait_for(lambda: len(pod_names(kube, job)) == 2, what="two node pods")
    set_terminated(kube, f"{job}-node-1", 1)
    kube.wait_for(lambda: status(kube, job).get("phase") == C.PHASE_FAILED, timeout=20, what="phase Failed")
    assert condition(kube, C.COND_FAILED, job)["reason"] == C.REASON_RESTARTS_EXHAUSTED


def test_a_disrupted_node_is_replaced_without_spending_the_budget(operator):
    kube, job = operator.kube, operator.job
    kube.create("ddpjobs", status_manifest(job, replicas=2, failurePolicy={"maxRestarts": 0}))
    kube.wait_for(lambda: len(pod_names(kube, job)) == 2, what="two node pods")
    victim = f"{job}-node-1"
    old_uid = kube.get("pods", victim)["metadata"]["uid"]
    kube.patch("pods", victim, {"status": {"phase": "Failed", "reason": "Evicted", "conditions": [
        {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
         "lastTransitionTime": now_rfc3339()}],
        "containerStatuses": [{"name": C.CONTAINER_NAME, "image": "sandbox", "imageID": "", "ready": False,
                               "restartCount": 0, "state": {"terminated": {
                                   "exitCode": 137, "reason": "Error", "finishedAt": now_rfc3339()}}}]}},
        subresource="status")
    kube.wait_for(lambda: (p := kube.find("pods", victim)) and p["metadata"]["uid"] != old_uid, timeout=20,
                  what="the evicted node to be replaced")
    assert status(kube, job).get("restarts", 0) == 0
    assert status(kube, job)["phase"] != C.PHASE_FAILED


def test_a_node_pod_deleted_by_someone_else_is_created_again(operator):
    kube, job = operator.kube, operator.job
    kube.create("ddpjobs", status_manifest(job, replicas=2))
    kube.wait_for(lambda: len(pod_names(kube, job)) == 2, what="two node pods")
    old_uid = kube.get("pods", f"{job}-node-0")["metadata"]["uid"]
    kube.delete("pods", f"{job}-node-0")  # graceful, as `kubectl delete pod` does: its Node removes it
    kube.wait_for(lambda: (p := kube.find("pods", f"{job}-node-0")) and p["metadata"]["uid"] != old_uid, timeout=20,
                  what=f"{job}-node-0 to be created again")


def test_fixing_an_invalid_spec_starts_the_job(operator):
    kube, job = operator.kube, operator.job
    kube.create("ddpjobs", status_manifest(job, replicas=2, **BAD_LABELS))
    kube.wait_for(lambda: condition(kube, C.COND_INVALID_SPEC, job), what="InvalidSpec")
    assert "team name" in condition(kube, C.COND_INVALID_SPEC, job)["message"]
    # The Event follows the pass's writes: a pod of that pass would be stored by now.
    wait_for_event(kube, C.REASON_INVALID_SPEC, timeout=15, job=job)
    assert pod_names(kube, job) == []
    kube.patch("ddpjobs", job, {"spec": {"podOverrides": {"labels": {"team name": None, "team": "a"}}}})
    kube.wait_for(lambda: len(pod_names(kube, job)) == 2, timeout=20, what="pods once the spec is valid")
    kube.wait_for(lambda: (condition(kube, C.COND_INVALID_SPEC, job) or {}).get("status") != "True", timeout=15,
                  what="InvalidSpec to be cleared")


def test_an_invalid_edit_of_a_running_job_still_replaces_its_failed_pods(operator):
    kube, job = operator.kube, operator.job
    kube.create("ddpjobs", status_manifest(job, replicas=2))
    kube.wait_for(lambda: len(pod_names(kube, job)) == 2, what="two node pods")
    for pod in pod_names(kube, job):
        set_running(kube, pod)
    kube.wait_for(lambda: status(kube, job).get("phase") == C.PHASE_RUNNING, what="phase Running")
    assert status(kube, job)["lastValid"]["generation"] == 1
    kube.patch("ddpjobs", job, {"spec": BAD_LABELS})
    kube.wait_for(lambda: (condition(kube, C.COND_INVALID_SPEC, job) or {}).get("status") == "True",
                  what="InvalidSpec")
    assert "last valid spec (generation 1)" in condition(kube, C.COND_INVALID_SPEC, job)["message"]
    victim = f"{job}-node-1"
    old_uid = kube.get("pods", victim)["metadata"]["uid"]
    set_terminated(kube, victim, 1)
    kube.wait_for(lambda: (p := kube.find("pods", victim)) and p["metadata"]["uid"] != old_uid, timeout=20,
                  what="the failed node to be replaced from the last valid spec")
    assert status(kube, job)["phase"] == C.PHASE_RESTARTING and status(kube, job)["restarts"] == 1
    assert "team name" not in kube.get("pods", victim)["metadata"]["labels"]
