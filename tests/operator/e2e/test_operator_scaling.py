"""Scaling, suspension and operator restarts, with the real operator against the emulator."""
import json
import pathlib
import time

from ddpjob_operator.api import constants as C
from ddpjob_sandbox.jobs import make_manifest
from ddpjob_sandbox.readers import pod_names, status
from ddpjob_sandbox.scripted import set_running
from ddpjob_sandbox.operator_process import OperatorProcess, operator_command

REPO = pathlib.Path(__file__).resolve().parents[3]


def elastic(replicas, low=1, high=4):
    return make_manifest(replicas=replicas, elasticPolicy={"minReplicas": low, "maxReplicas": high})


def nodes(count):
    return [f"mlp-node-{i}" for i in range(count)]


def test_scaling_by_spec_patch_adds_and_removes_the_highest_indexes(k8s, operator):
    k8s.create("ddpjobs", elastic(2))
    k8s.wait_for(lambda: pod_names(k8s) == nodes(2), what="two node pods")
    kept = k8s.get("pods", "mlp-node-0")["metadata"]["uid"]
    k8s.patch("ddpjobs", "mlp", {"spec": {"replicas": 3}})
    k8s.wait_for(lambda: pod_names(k8s) == nodes(3), what="a third node pod")
    k8s.patch("ddpjobs", "mlp", {"spec": {"replicas": 1}})
    k8s.wait_for(lambda: pod_names(k8s) == nodes(1), what="scale-down to node 0 only")
    assert k8s.get("pods", "mlp-node-0")["metadata"]["uid"] == kept, "node 0 hosts the rendezvous: never replaced"
    k8s.wait_for(lambda: status(k8s).get("replicas") == 1, timeout=15, what="status.replicas == 1")


def test_kubectl_scale_goes_through_the_scale_subresource_to_the_operator(k8s, operator):
    k8s.create("ddpjobs", elastic(2))
    k8s.wait_for(lambda: pod_names(k8s) == nodes(2), what="two node pods")
    k8s.kubectl("scale", "ddpjob/mlp", "--replicas=4")
    k8s.wait_for(lambda: pod_names(k8s) == nodes(4), what="four node pods after kubectl scale")
    k8s.wait_for(lambda: k8s.get("ddpjobs", "mlp", subresource="scale")["status"]["replicas"] == 4, timeout=15,
                 what="the scale subresource to report 4 observed replicas")
    k8s.kubectl("scale", "ddpj/mlp", "--replicas=1")
    k8s.wait_for(lambda: pod_names(k8s) == nodes(1), what="one node pod after kubectl scale")


def test_suspend_deletes_pods_but_keeps_service_and_status_and_resume_recreates_them(k8s, operator):
    k8s.create("ddpjobs", make_manifest(replicas=2))
    k8s.wait_for(lambda: pod_names(k8s) == nodes(2), what="two node pods")
    for name in nodes(2):
        set_running(k8s, name)
    k8s.wait_for(lambda: status(k8s).get("phase") == C.PHASE_RUNNING, what="phase Running")
    k8s.patch("ddpjobs", "mlp", {"spec": {"runPolicy": {"suspend": True}}})
    k8s.wait_for(lambda: pod_names(k8s) == [], what="suspension to delete the pods")
    k8s.wait_for(lambda: status(k8s).get("phase") == C.PHASE_SUSPENDED, timeout=15, what="phase Suspended")
    assert k8s.find("services", "mlp") is not None
    assert status(k8s)["selector"] == f"{C.LABEL_JOB_NAME}=mlp,{C.LABEL_COMPONENT}=node"
    assert k8s.find("pods", "mlp-rdzv") is None, "a suspended job keeps no rendezvous store pod"
    k8s.patch("ddpjobs", "mlp", {"spec": {"runPolicy": {"suspend": False}}})
    k8s.wait_for(lambda: pod_names(k8s) == nodes(2), what="resume to recreate the pods")
    k8s.wait_for(lambda: status(k8s).get("phase") == C.PHASE_PENDING, timeout=15, what="phase Pending after resume")
    assert status(k8s).get("restarts", 0) == 0, "a suspension is not a failure"


def test_an_operator_killed_mid_pass_resumes_without_duplicate_pods(cluster, k8s, tmp_path):
    k8s.create("ddpjobs", make_manifest(replicas=6))
    cluster.emulator.write_latency = 0.4  # a slow API: the first pass is still writing when killed
    first = OperatorProcess(cluster, operator_command(k8s.namespace), tmp_path / "first.log").start()
    try:
        k8s.wait_for(lambda: k8s.find("services", "mlp") or pod_names(k8s), timeout=20, interval=0.02,
                     what="the first operator to start writing")
    finally:
        first.kill()
    created_before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in k8s.list("pods")}
    # the store pod comes first, then the six node pods
    assert len(created_before) < 7, f"the first operator finished its pass before the kill: {created_before}"
    cluster.emulator.write_latency = 0.0
    with OperatorProcess(cluster, operator_command(k8s.namespace), tmp_path / "second.log") as second:
        k8s.wait_for(lambda: pod_names(k8s) == nodes(6), what="the restarted operator to finish the pods")
        time.sleep(0.5)
        pods = k8s.list("pods")
        assert sorted(p["metadata"]["name"] for p in pods) == [*nodes(6), "mlp-rdzv"]
        for pod in pods:  # pods from before the kill are kept, not deleted and created again
            name = pod["metadata"]["name"]
            assert created_before.get(name, pod["metadata"]["uid"]) == pod["metadata"]["uid"]
        assert len(k8s.list("services")) == 2  # the headless one and the store pod's
        assert status(k8s).get("restarts", 0) == 0
    assert "Traceback" not in second.log(), second.log()[-4000:]


def test_kubectl_apply_of_the_example_manifest_starts_the_job(k8s, operator):
    manifest = REPO / "manifests" / "examples" / "ddpjob-c10d.yaml"
    applied = k8s.kubectl("apply", "--validate=false", "-f", str(manifest)).stdout
    name = applied.split()[0].split("/")[-1]
    replicas = k8s.get("ddpjobs", name)["spec"]["replicas"]
    k8s.wait_for(lambda: len(pod_names(k8s, name)) == replicas, what=f"{replicas} pods of the example job")
    listed = json.loads(k8s.kubectl("get", "ddpjobs", "-o", "json").stdout)["items"]
    assert [item["metadata"]["name"] for item in listed] == [name]
    k8s.wait_for(lambda: listed and (k8s.get("ddpjobs", name).get("status") or {}).get("phase") == C.PHASE_PENDING,
                 timeout=15, what="the example job's status")


def test_kubectl_describe_shows_the_operator_events(k8s, operator):
    k8s.create("ddpjobs", make_manifest(replicas=1))
    k8s.wait_for(lambda: pod_names(k8s) == ["mlp-node-0"], what="the node pod")
    k8s.wait_for(lambda: k8s.list("events"), timeout=15, what="an Event about the job")
    described = k8s.kubectl("describe", "ddpjob", "mlp").stdout
    reasons = {e["reason"] for e in k8s.list("events")}
    assert "Events:" in described and any(reason in described for reason in reasons), described
