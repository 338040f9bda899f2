"""Scaling, suspension and operator restarts, with the helm-installed operator on the real
control plane: `kubectl scale` goes through the CRD's scale subresource as the real API server
serves it, `kubectl describe` shows the job's history from the real Events."""
import json

import pytest
import yaml

from ddpjob_operator.api import constants as C
from ddpjob_operator.render.common import job_selector
from ddpjob_sandbox.readers import pod_names, status
from ddpjob_sandbox.scripted import set_running
from tests.cluster.crds import REPO
from tests.cluster.installed_operator import OPERATOR_READY_SECONDS, operator_selector
from tests.cluster.operators import kubelet_container, on_status_nodes, status_manifest

pytestmark = pytest.mark.cluster


def elastic(name, replicas, low=1, high=4):
    return status_manifest(name, replicas=replicas, elasticPolicy={"minReplicas": low, "maxReplicas": high})


def nodes(job, count):
    return [f"{job}-node-{i}" for i in range(count)]


def test_scaling_by_spec_patch_adds_and_removes_the_highest_indexes(operator):
    kube, job = operator.kube, operator.job
    kube.create("ddpjobs", elastic(job, 2))
    kube.wait_for(lambda: pod_names(kube, job) == nodes(job, 2), what="two node pods")
    kept = kube.get("pods", f"{job}-node-0")["metadata"]["uid"]
    kube.patch("ddpjobs", job, {"spec": {"replicas": 3}})
    kube.wait_for(lambda: pod_names(kube, job) == nodes(job, 3), what="a third node pod")
    kube.patch("ddpjobs", job, {"spec": {"replicas": 1}})
    kube.wait_for(lambda: pod_names(kube, job) == nodes(job, 1), what="scale-down to node 0 only")
    assert kube.get("pods", f"{job}-node-0")["metadata"]["uid"] == kept, "node 0 hosts the rendezvous: never replaced"
    kube.wait_for(lambda: status(kube, job).get("replicas") == 1, timeout=15, what="status.replicas == 1")


def test_kubectl_scale_goes_through_the_scale_subresource_to_the_operator(operator):
    kube, job = operator.kube, operator.job
    kube.create("ddpjobs", elastic(job, 2))
    kube.wait_for(lambda: pod_names(kube, job) == nodes(job, 2), what="two node pods")
    kube.kubectl("scale", f"ddpjob/{job}", "--replicas=4")
    kube.wait_for(lambda: pod_names(kube, job) == nodes(job, 4), what="four node pods after kubectl scale")
    kube.wait_for(lambda: kube.get("ddpjobs", job, subresource="scale")["status"]["replicas"] == 4, timeout=15,
                  what="the scale subresource to report 4 observed replicas")
    scale = kube.get("ddpjobs", job, subresource="scale")
    assert (scale["kind"], scale["spec"]["replicas"]) == ("Scale", 4)
    assert scale["status"]["selector"] == f"{C.LABEL_JOB_NAME}={job},{C.LABEL_COMPONENT}=node"
    kube.kubectl("scale", f"ddpj/{job}", "--replicas=1")
    kube.wait_for(lambda: pod_names(kube, job) == nodes(job, 1), what="one node pod after kubectl scale")
    # The CRD's bounds hold on the scale subresource too: the API server refuses 0 replicas.
    refused = kube.kubectl("scale", f"ddpj/{job}", "--replicas=0", check=False)
    assert refused.returncode != 0 and "spec.replicas" in refused.stderr, refused.stderr


def test_suspend_deletes_pods_but_keeps_service_and_status_and_resume_recreates_them(operator):
    kube, job = operator.kube, operator.job
    kube.create("ddpjobs", status_manifest(job, replicas=2, elasticPolicy={"rdzvStore": "pod"}))
    kube.wait_for(lambda: pod_names(kube, job) == nodes(job, 2), what="two node pods")
    for name in nodes(job, 2):
        set_running(kube, name)
    kube.wait_for(lambda: status(kube, job).get("phase") == C.PHASE_RUNNING, what="phase Running")
    kube.patch("ddpjobs", job, {"spec": {"runPolicy": {"suspend": True}}})
    kube.wait_for(lambda: pod_names(kube, job) == [], what="suspension to delete the pods")
    kube.wait_for(lambda: status(kube, job).get("phase") == C.PHASE_SUSPENDED, timeout=15, what="phase Suspended")
    assert kube.find("services", job) is not None
    assert status(kube, job)["selector"] == f"{C.LABEL_JOB_NAME}={job},{C.LABEL_COMPONENT}=node"
    kube.wait_for(lambda: kube.find("pods", f"{job}-rdzv") is None, timeout=15,
                  what="the store pod gone: a suspended job keeps no rendezvous store pod")
    kube.patch("ddpjobs", job, {"spec": {"runPolicy": {"suspend": False}}})
    kube.wait_for(lambda: pod_names(kube, job) == nodes(job, 2), what="resume to recreate the pods")
    kube.wait_for(lambda: status(kube, job).get("phase") == C.PHASE_PENDING, timeout=15,
                  what="phase Pending after resume")
    assert status(kube, job).get("restarts", 0) == 0, "a suspension is not a failure"


def test_kubectl_apply_of_the_example_manifest_starts_the_job(operator, tmp_path):
    kube, job = operator.kube, operator.job
    example = yaml.safe_load((REPO / "manifests" / "examples" / "ddpjob-c10d.yaml").read_text())
    example["metadata"]["name"] = job  # its pods on the status-only Nodes: this test runs none of them
    manifest = tmp_path / "ddpjob-c10d.yaml"
    manifest.write_text(yaml.safe_dump(on_status_nodes(example)))
    # The real API server validates the manifest against the CRD's schema (kubectl's default).
    applied = kube.kubectl("apply", "-f", str(manifest)).stdout
    assert applied.split()[0] == f"ddpjob.ddpjob.io/{job}", applied
    replicas = kube.get("ddpjobs", job)["spec"]["replicas"]
    kube.wait_for(lambda: len(pod_names(kube, job)) == replicas, what=f"{replicas} pods of the example job")
    listed = json.loads(kube.kubectl("get", "ddpjobs", "-o", "json").stdout)["items"]
    assert [item["metadata"]["name"] for item in listed] == [job]
    kube.wait_for(lambda: status(kube, job).get("phase") == C.PHASE_PENDING, timeout=15,
                  what="the example job's status")


def test_kubectl_describe_shows_the_jobs_history(operator):
    kube, job = operator.kube, operator.job
    kube.create("ddpjobs", status_manifest(job, replicas=1))
    kube.wait_for(lambda: pod_names(kube, job) == [f"{job}-node-0"], what="the node pod")
    set_running(kube, f"{job}-node-0")
    kube.wait_for(lambda: status(kube, job).get("phase") == C.PHASE_RUNNING, what="phase Running")
    history = {C.REASON_CREATED, C.REASON_RUNNING}
    kube.wait_for(lambda: history <= {e["reason"] for e in kube.list("events") if e["involvedObject"]["name"] == job},
                  timeout=15, what=f"the operator's Events {sorted(history)} about the job")
    described = kube.kubectl("describe", "ddpjob", job).stdout
    # kubectl finds the Events by the job's uid (involvedObject), as it does for any kind.
    head, _, events_part = described.partition("\nEvents:")
    assert all(reason in events_part for reason in history), described
    assert "Phase:" in head and C.PHASE_RUNNING in head, described


# One API request per second: the operator's first pass over a 6-node job takes seconds, so the
# test can kill it in the middle (against the emulator, a write latency did this).
SLOW_API = ("--kube-api-qps", "1", "--kube-api-burst", "1")


@pytest.mark.operator_args(*SLOW_API)
@pytest.mark.timeout(OPERATOR_READY_SECONDS + 180)
def test_an_operator_killed_mid_pass_resumes_without_duplicate_pods(operator):
    kube, job = operator.kube, operator.job
    selector = operator_selector(operator.installed.release)
    (first,) = kube.list("pods", label_selector=selector)
    kube.create("ddpjobs", status_manifest(job, replicas=6))
    kube.wait_for(lambda: kube.find("services", job) or pod_names(kube, job), timeout=30, interval=0.02,
                  what="the operator to start writing")
    kubelet_container(operator, first).kill()  # SIGKILL: no chance to finish or clean up
    kube.delete("pods", first["metadata"]["name"], gracePeriodSeconds=0)  # its ReplicaSet starts another
    created_before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in kube.list("pods", label_selector=job_selector(job))}
    assert len(created_before) < 6, f"the first operator finished its pass before the kill: {created_before}"
    kube.wait_for(lambda: any(p["metadata"]["uid"] != first["metadata"]["uid"]
                              and (p.get("status") or {}).get("phase") == "Running"
                              for p in kube.list("pods", label_selector=selector)),
                  timeout=OPERATOR_READY_SECONDS, interval=0.5, what="the Deployment's new operator pod running")
    kube.wait_for(lambda: pod_names(kube, job) == nodes(job, 6), timeout=90, interval=0.5,
                  what="the restarted operator to finish the pods")
    pods = kube.list("pods", label_selector=job_selector(job))
    assert sorted(p["metadata"]["name"] for p in pods) == nodes(job, 6)
    for pod in pods:  # pods from before the kill are kept, not deleted and created again
        name = pod["metadata"]["name"]
        assert created_before.get(name, pod["metadata"]["uid"]) == pod["metadata"]["uid"]
    assert [s["metadata"]["name"] for s in kube.list("services", label_selector=job_selector(job))] == [job]
    assert status(kube, job).get("restarts", 0) == 0
