"""The helm-installed operator on the real control plane: a job's pods are created, failed nodes
are replaced or fail the job, success finishes it.

The pods go to Nodes that run no process (status_nodes): the test reports their states by
writing the pods' status subresource exactly as a kubelet would (phase plus the container's
terminated exit code); the scheduler, admission and the garbage collector are the real ones.
"""
import time

import pytest

from ddpjob_operator.api import constants as C
from ddpjob_sandbox.readers import condition, events, pod_names, status, wait_for_event
from ddpjob_sandbox.scripted import set_running, set_terminated
from tests.cluster.operators import status_manifest

pytestmark = pytest.mark.cluster


def has_event(kube, job: str, kind: str, reason: str) -> bool:
    return any((k, r) == (kind, reason) for k, r, _ in events(kube, job))


def env_of(pod: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}


def test_a_new_job_gets_a_headless_service_and_one_torchrun_pod_per_node(operator):
    kube, job = operator.kube, operator.job
    created = kube.create("ddpjobs", status_manifest(job, replicas=3, elasticPolicy={"rdzvStore": "pod"}))
    uid = created["metadata"]["uid"]
    nodes = [f"{job}-node-{i}" for i in range(3)]
    kube.wait_for(lambda: pod_names(kube, job) == nodes, timeout=15, what="three node pods")
    service = kube.get("services", job)
    assert service["spec"]["clusterIP"] == "None"
    assert service["metadata"]["ownerReferences"][0]["uid"] == uid
    pod = kube.get("pods", f"{job}-node-1")
    container = pod["spec"]["containers"][0]
    assert container["command"] == ["torchrun"]
    assert container["args"] == ["-m", "ddpjob_trainer.examples.mlp", "--epochs", "2"]
    env = env_of(pod)
    assert env["PET_NNODES"] == "3:3" and env["PET_RDZV_ID"] == uid and env["PET_RDZV_BACKEND"] == "c10d"
    assert env["PET_RDZV_ENDPOINT"] == f"{job}-rdzv.{kube.namespace}.svc.cluster.local:29400"  # the store pod
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1" and env["DDPJOB_NODE_INDEX"] == "1"
    assert (pod["spec"]["hostname"], pod["spec"]["subdomain"]) == (f"{job}-node-1", job)
    assert pod["metadata"]["labels"][C.LABEL_NODE_INDEX] == "1"
    assert pod["metadata"]["ownerReferences"][0] == {**pod["metadata"]["ownerReferences"][0], "uid": uid,
                                                    "controller": True}
    assert kube.find("pods", f"{job}-rdzv") is not None and kube.find("services", f"{job}-rdzv") is not None
    selector = f"{C.LABEL_JOB_NAME}={job},{C.LABEL_COMPONENT}=node"
    kube.wait_for(lambda: status(kube, job).get("selector") == selector, timeout=15,
                  what="status.selector for the scale subresource")
    assert sorted(p["metadata"]["name"] for p in kube.list("pods", label_selector=selector)) == nodes
    # the store pod is no node: an HPA never counts it


def test_the_job_runs_when_its_pods_run_and_succeeds_when_all_exit_zero(operator):
    kube, job = operator.kube, operator.job
    kube.create("ddpjobs", status_manifest(job, replicas=2, runPolicy={"cleanPodPolicy": "All"}))
    kube.wait_for(lambda: len(pod_names(kube, job)) == 2, what="two node pods")
    for name in pod_names(kube, job):
        set_running(kube, name)
    kube.wait_for(lambda: status(kube, job).get("phase") == C.PHASE_RUNNING, timeout=20, what="phase Running")
    assert status(kube, job)["readyReplicas"] == 2
    for name in pod_names(kube, job):
        set_terminated(kube, name, 0)
    kube.wait_for(lambda: status(kube, job).get("phase") == C.PHASE_SUCCEEDED, timeout=20, what="phase Succeeded")
    assert status(kube, job)["completionTime"]
    kube.wait_for(lambda: pod_names(kube, job) == [], timeout=20, what="cleanPodPolicy All to delete the pods")
    wait_for_event(kube, C.REASON_SUCCEEDED, timeout=15, job=job)  # posted after the pass's writes


def test_succeeded_pods_are_kept_with_the_default_clean_pod_policy(operator):
    kube, job = operator.kube, operator.job
    kube.create("ddpjobs", status_manifest(job, replicas=2))
    kube.wait_for(lambda: len(pod_names(kube, job)) == 2, what="two node pods")
    # Both run before either exits, as a kubelet reports them, and the operator has seen both run
    # (readyReplicas 2: its cache holds them Running; pods' events reach it per object, not in one
    # order). Ended straight from Pending, a pass between the two patches sees node 0 Succeeded
    # beside a node 1 that never ran: by design that finishes the job (a Pending pod cannot join
    # the closed rendezvous) and cleanPodPolicy Running deletes it. Now such a pass sees node 1
    # Running: training finishing, nothing to clean.
    for name in pod_names(kube, job):
        set_running(kube, name)
    kube.wait_for(lambda: status(kube, job).get("readyReplicas") == 2, timeout=20, what="both nodes seen running")
    for name in pod_names(kube, job):
        set_terminated(kube, name, 0)
    kube.wait_for(lambda: status(kube, job).get("phase") == C.PHASE_SUCCEEDED, timeout=20, what="phase Succeeded")
    # The Event comes after the finishing pass's writes: a clean-up of that pass would be visible by now.
    wait_for_event(kube, C.REASON_SUCCEEDED, timeout=15, job=job)
    assert pod_names(kube, job) == [f"{job}-node-0", f"{job}-node-1"]


def test_a_failed_node_is_replaced_under_the_same_name_at_once_and_again_after_the_backoff(operator):
    """The job's first incident is replaced at once; its replacement failing too is a crash loop,
    replaced only after backoffSeconds (the timer's rule: tests/operator/decide/test_plan.py)."""
    kube, job = operator.kube, operator.job
    kube.create("ddpjobs", status_manifest(job, replicas=2, failurePolicy={"maxRestarts": 3, "backoffSeconds": 2}))
    kube.wait_for(lambda: len(pod_names(kube, job)) == 2, what="two node pods")
    for name in pod_names(kube, job):
        set_running(kube, name)
    victim = f"{job}-node-1"
    for restarts in (1, 2):
        old_uid = kube.get("pods", victim)["metadata"]["uid"]
        failed_at = time.monotonic()
        set_terminated(kube, victim, 1)
        kube.wait_for(lambda: status(kube, job).get("restarts") == restarts, timeout=20,
                      what=f"status.restarts == {restarts}")
        if restarts == 2:  # in its backoff (the first is replaced in the next pass, and may run on at once)
            assert status(kube, job)["phase"] == C.PHASE_RESTARTING
        replaced = kube.wait_for(lambda: (p := kube.find("pods", victim)) and p["metadata"]["uid"] != old_uid and p,
                                 timeout=15, what=f"a new {victim}")
        waited = time.monotonic() - failed_at
        if restarts == 2:
            # The backoff counts from the container's finishedAt, which has whole-second precision.
            assert waited >= 1.0, f"the second replacement came after {waited:.2f} s, before backoffSeconds (2)"
        assert replaced["metadata"]["labels"][C.LABEL_NODE_INDEX] == "1"
        assert pod_names(kube, job) == [f"{job}-node-0", victim]
        set_running(kube, victim)
    kube.wait_for(lambda: has_event(kube, job, C.EVENT_WARNING, C.REASON_NODE_FAILED), timeout=15,
                  what="the Warning Event")
    kube.wait_for(lambda: status(kube, job).get("phase") == C.PHASE_RUNNING, timeout=20, what="Running again")
    assert status(kube, job)["restarts"] == 2


def test_a_permanent_exit_code_fails_the_job_with_the_reason_and_an_event(operator):
    kube, job = operator.kube, operator.job
    kube.create("ddpjobs", status_manifest(job, replicas=2))
    kube.wait_for(lambda: len(pod_names(kube, job)) == 2, what="two node pods")
    set_terminated(kube, f"{job}-node-0", 127)
    kube.wait_for(lambda: status(kube, job).get("phase") == C.PHASE_FAILED, timeout=20, what="phase Failed")
    failed = condition(kube, C.COND_FAILED, job)
    assert failed["status"] == "True" and failed["reason"] == C.REASON_PERMANENT_ERROR
    assert "127" in failed["message"]
    kube.wait_for(lambda: has_event(kube, job, C.EVENT_WARNING, C.REASON_PERMANENT_ERROR), timeout=15,
                  what="the Warning Event")
    # The job is Failed: no backoff timer is left to replace the pod, whatever time passes.
    assert kube.get("pods", f"{job}-node-0")["status"]["phase"] == "Failed"
    assert status(kube, job)["restarts"] == 0


def test_a_spec_invalid_to_the_operator_reports_invalid_spec_and_creates_nothing(operator):
    kube, job = operator.kube, operator.job
    # The CRD cannot say what a label key may be (its CEL has no such check; the API server refuses
    # the pod only): the operator does (tests/operator/corpus/label-key-with-a-space.yaml). A spec
    # with both module and script, which this test used against the emulator, the real API
    # server refuses at create (the CRD's rule).
    kube.create("ddpjobs", status_manifest(job, podOverrides={"labels": {"team name": "a"}}))
    kube.wait_for(lambda: condition(kube, C.COND_INVALID_SPEC, job), timeout=20, what="the InvalidSpec condition")
    invalid = condition(kube, C.COND_INVALID_SPEC, job)
    assert invalid["status"] == "True"
    assert invalid["message"].startswith('spec.podOverrides.labels key ("team name") must be a qualified name'), invalid
    assert status(kube, job)["phase"] == C.PHASE_FAILED
    kube.wait_for(lambda: has_event(kube, job, C.EVENT_WARNING, C.REASON_INVALID_SPEC), timeout=15,
                  what="the Warning Event")
    # The Event follows the pass's writes: a pod or Service of that pass would be stored by now.
    assert pod_names(kube, job) == [] and kube.find("services", job) is None
