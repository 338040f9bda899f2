"""The real operator (``python -m ddpjob_operator``) over HTTP against the API emulator:
a job's pods are created, failed nodes are replaced or fail the job, success finishes it.

The emulator runs no kubelet: tests report pod states by patching the pods' status
subresource exactly as a kubelet would (phase plus the container's terminated exit code).
"""
import time

from ddpjob_operator.api import constants as C
from ddpjob_sandbox.readers import condition, events, pod_names, status
from ddpjob_sandbox.jobs import make_manifest
from ddpjob_sandbox.scripted import set_running, set_terminated


def has_event(k8s, kind: str, reason: str) -> bool:
    return any((k, r) == (kind, reason) for k, r, _ in events(k8s))


def env_of(pod: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}


def test_a_new_job_gets_a_headless_service_and_one_torchrun_pod_per_node(k8s, operator):
    job = k8s.create("ddpjobs", make_manifest(replicas=3))
    uid = job["metadata"]["uid"]
    k8s.wait_for(lambda: pod_names(k8s) == ["mlp-node-0", "mlp-node-1", "mlp-node-2"], timeout=15,
                 what="three node pods")
    service = k8s.get("services", "mlp")
    assert service["spec"]["clusterIP"] == "None"
    assert service["metadata"]["ownerReferences"][0]["uid"] == uid
    pod = k8s.get("pods", "mlp-node-1")
    container = pod["spec"]["containers"][0]
    assert container["command"] == ["torchrun"]
    assert container["args"] == ["-m", "ddpjob_trainer.examples.mlp", "--epochs", "2"]
    env = env_of(pod)
    assert env["PET_NNODES"] == "3:3" and env["PET_RDZV_ID"] == uid and env["PET_RDZV_BACKEND"] == "c10d"
    assert env["PET_RDZV_ENDPOINT"] == f"mlp-rdzv.{k8s.namespace}.svc.cluster.local:29400"  # the store pod
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1" and env["DDPJOB_NODE_INDEX"] == "1"
    assert (pod["spec"]["hostname"], pod["spec"]["subdomain"]) == ("mlp-node-1", "mlp")
    assert pod["metadata"]["labels"][C.LABEL_NODE_INDEX] == "1"
    assert pod["metadata"]["ownerReferences"][0] == {**pod["metadata"]["ownerReferences"][0], "uid": uid,
                                                    "controller": True}
    assert k8s.find("pods", "mlp-rdzv") is not None and k8s.find("services", "mlp-rdzv") is not None
    selector = f"{C.LABEL_JOB_NAME}=mlp,{C.LABEL_COMPONENT}=node"
    k8s.wait_for(lambda: status(k8s).get("selector") == selector, timeout=15,
                 what="status.selector for the scale subresource")
    assert sorted(p["metadata"]["name"] for p in k8s.list("pods", label_selector=selector)) == [
        "mlp-node-0", "mlp-node-1", "mlp-node-2"]  # the store pod is no node: an HPA never counts it


def test_the_job_runs_when_its_pods_run_and_succeeds_when_all_exit_zero(k8s, operator):
    k8s.create("ddpjobs", make_manifest(replicas=2, runPolicy={"cleanPodPolicy": "All"}))
    k8s.wait_for(lambda: len(pod_names(k8s)) == 2, what="two node pods")
    for name in pod_names(k8s):
        set_running(k8s, name)
    k8s.wait_for(lambda: status(k8s).get("phase") == C.PHASE_RUNNING, timeout=20, what="phase Running")
    assert status(k8s)["readyReplicas"] == 2
    for name in pod_names(k8s):
        set_terminated(k8s, name, 0)
    k8s.wait_for(lambda: status(k8s).get("phase") == C.PHASE_SUCCEEDED, timeout=20, what="phase Succeeded")
    assert status(k8s)["completionTime"]
    k8s.wait_for(lambda: pod_names(k8s) == [], timeout=20, what="cleanPodPolicy All to delete the pods")
    k8s.wait_for(lambda: any(reason == C.REASON_SUCCEEDED for _, reason, _ in events(k8s)), timeout=15,
                 what="the AllNodesSucceeded Event (posted after the pass's writes)")


def test_succeeded_pods_are_kept_with_the_default_clean_pod_policy(k8s, operator):
    k8s.create("ddpjobs", make_manifest(replicas=2))
    k8s.wait_for(lambda: len(pod_names(k8s)) == 2, what="two node pods")
    # Both run before either exits, as a kubelet reports them, and the operator has seen both run
    # (readyReplicas 2: its cache holds them Running; pods' events reach it per object, not in one
    # order). Ended straight from Pending, a pass between the two patches sees node 0 Succeeded
    # beside a node 1 that never ran: by design that finishes the job (a Pending pod cannot join
    # the closed rendezvous) and cleanPodPolicy Running deletes it. Now such a pass sees node 1
    # Running: training finishing, nothing to clean.
    for name in pod_names(k8s):
        set_running(k8s, name)
    k8s.wait_for(lambda: status(k8s).get("readyReplicas") == 2, timeout=20, what="both nodes seen running")
    for name in pod_names(k8s):
        set_terminated(k8s, name, 0)
    k8s.wait_for(lambda: status(k8s).get("phase") == C.PHASE_SUCCEEDED, timeout=20, what="phase Succeeded")
    time.sleep(0.5)
    assert pod_names(k8s) == ["mlp-node-0", "mlp-node-1"]


def test_a_failed_node_is_replaced_under_the_same_name_after_the_backoff(k8s, operator):
    k8s.create("ddpjobs", make_manifest(replicas=2, failurePolicy={"maxRestarts": 3, "backoffSeconds": 2}))
    k8s.wait_for(lambda: len(pod_names(k8s)) == 2, what="two node pods")
    for name in pod_names(k8s):
        set_running(k8s, name)
    old_uid = k8s.get("pods", "mlp-node-1")["metadata"]["uid"]
    failed_at = time.monotonic()
    set_terminated(k8s, "mlp-node-1", 1)
    k8s.wait_for(lambda: status(k8s).get("restarts") == 1, timeout=20, what="status.restarts == 1")
    assert status(k8s)["phase"] == C.PHASE_RESTARTING
    replaced = k8s.wait_for(lambda: (p := k8s.find("pods", "mlp-node-1")) and p["metadata"]["uid"] != old_uid and p,
                            timeout=15, what="a new mlp-node-1")
    waited = time.monotonic() - failed_at
    # The backoff counts from the container's finishedAt, which has whole-second precision.
    assert waited >= 1.0, f"replaced after {waited:.2f} s, before backoffSeconds (2) passed"
    assert replaced["metadata"]["labels"][C.LABEL_NODE_INDEX] == "1"
    assert pod_names(k8s) == ["mlp-node-0", "mlp-node-1"]
    k8s.wait_for(lambda: has_event(k8s, C.EVENT_WARNING, C.REASON_NODE_FAILED), timeout=15, what="the Warning Event")
    set_running(k8s, "mlp-node-1")
    k8s.wait_for(lambda: status(k8s).get("phase") == C.PHASE_RUNNING, timeout=20, what="Running again")
    assert status(k8s)["restarts"] == 1


def test_a_permanent_exit_code_fails_the_job_with_the_reason_and_an_event(k8s, operator):
    k8s.create("ddpjobs", make_manifest(replicas=2))
    k8s.wait_for(lambda: len(pod_names(k8s)) == 2, what="two node pods")
    set_terminated(k8s, "mlp-node-0", 127)
    k8s.wait_for(lambda: status(k8s).get("phase") == C.PHASE_FAILED, timeout=20, what="phase Failed")
    failed = condition(k8s, C.COND_FAILED)
    assert failed["status"] == "True" and failed["reason"] == C.REASON_PERMANENT_ERROR
    assert "127" in failed["message"]
    k8s.wait_for(lambda: has_event(k8s, C.EVENT_WARNING, C.REASON_PERMANENT_ERROR), timeout=15,
                 what="the Warning Event")
    time.sleep(1.5)  # longer than the backoff: still nothing is replaced
    assert k8s.get("pods", "mlp-node-0")["status"]["phase"] == "Failed"
    assert status(k8s)["restarts"] == 0


def test_a_spec_invalid_to_the_operator_reports_invalid_spec_and_creates_nothing(k8s, operator):
    k8s.create("ddpjobs", make_manifest(script="/workspace/train.py"))  # module and script both set
    k8s.wait_for(lambda: condition(k8s, C.COND_INVALID_SPEC), timeout=20, what="the InvalidSpec condition")
    invalid = condition(k8s, C.COND_INVALID_SPEC)
    assert invalid["status"] == "True"
    assert "spec.script" in invalid["message"] and "spec.module" in invalid["message"]
    assert status(k8s)["phase"] == C.PHASE_FAILED
    k8s.wait_for(lambda: has_event(k8s, C.EVENT_WARNING, C.REASON_INVALID_SPEC), timeout=15, what="the Warning Event")
    time.sleep(0.5)
    assert pod_names(k8s) == [] and k8s.find("services", "mlp") is None
