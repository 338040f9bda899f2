"""A pod is the job's only when the job is its controller: copied labels claim nothing.
The helm-installed operator on the real control plane. Without the ownerReference rule, a pod
that anyone in the namespace creates with a job's labels is counted in its status, asked for
progress, and deleted by scale-down as if it were a node of the job.
"""
import urllib.parse

import pytest

from ddpjob_operator.api import constants as C
from ddpjob_operator.render.common import pod_labels
from ddpjob_sandbox.control_plane.scripted_nodes import STATUS_ONLY_LABEL, STATUS_ONLY_TOLERATION
from ddpjob_sandbox.readers import condition, events, pod_names, status
from ddpjob_sandbox.scripted import set_running
from tests.cluster.installed_operator import audit_events, audit_offset
from tests.cluster.operators import status_manifest

pytestmark = pytest.mark.cluster


def foreign_pod(name: str, labels: dict | None = None) -> dict:
    """A pod someone else creates (no owner), fit for Pod Security `restricted`, on a status-only
    Node: nothing runs it."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels or {}},
            "spec": {"nodeSelector": {STATUS_ONLY_LABEL: "true"}, "tolerations": [dict(STATUS_ONLY_TOLERATION)],
                     "securityContext": {"runAsNonRoot": True, "runAsUser": 1000,
                                         "seccompProfile": {"type": "RuntimeDefault"}},
                     "containers": [{"name": C.CONTAINER_NAME, "image": "busybox", "securityContext": {
                         "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}]}}


def impostor(job: str, index: int) -> dict:
    """A pod with every label of node ``index`` of ``job``, and no owner."""
    return foreign_pod(f"{job}-impostor-{index}", pod_labels(job, index))


def one_more_pass(kube, job: str, args: list[str]) -> None:
    """Edits the job and waits until the operator has passed over the edit."""
    kube.patch("ddpjobs", job, {"spec": {"args": args}})
    generation = kube.get("ddpjobs", job)["metadata"]["generation"]
    kube.wait_for(lambda: status(kube, job).get("observedGeneration") == generation, what="a pass over the edited job")


def test_a_pod_with_the_jobs_labels_but_no_owner_is_neither_counted_nor_deleted(operator):
    kube, job = operator.kube, operator.job
    kube.create("ddpjobs", status_manifest(job, replicas=1))
    kube.wait_for(lambda: pod_names(kube, job) == [f"{job}-node-0"], what="the node pod")
    kube.create("pods", impostor(job, 5))  # an index above replicas: scale-down would delete a node pod there
    set_running(kube, f"{job}-impostor-5")
    set_running(kube, f"{job}-node-0")
    kube.wait_for(lambda: status(kube, job).get("phase") == C.PHASE_RUNNING, what="phase Running")
    one_more_pass(kube, job, ["--epochs", "3"])
    assert kube.find("pods", f"{job}-impostor-5") is not None, "the operator deleted a pod it does not own"
    assert (status(kube, job)["replicas"], status(kube, job)["readyReplicas"]) == (1, 1)
    assert not any("impostor" in message for _, _, message in events(kube, job))


def operator_reads(control_plane, account: str, name: str, since: int = 0) -> int:
    """The operator's reads of pod ``name`` (a LIST by name), from the API server's audit log."""
    wanted = "fieldSelector=" + urllib.parse.quote(f"metadata.name={name}", safe="")
    return sum(1 for e in audit_events(control_plane, since)
               if (e["verb"], e["user"]["username"]) == ("list", account) and wanted in e.get("requestURI", ""))


def test_a_foreign_pod_bearing_a_node_pods_name_is_reported_on_the_job_and_not_read_every_pass(
        operator, control_plane):
    kube, job = operator.kube, operator.job
    squatter = f"{job}-node-0"
    since = audit_offset(control_plane)
    kube.create("pods", foreign_pod(squatter))  # before the job: the operator's create of it meets it (409)
    kube.create("ddpjobs", status_manifest(job, replicas=1))
    refused = kube.wait_for(lambda: (c := condition(kube, "PodCreateFailed", job)) and c["status"] == "True" and c,
                            what="PodCreateFailed about the foreign pod")
    assert refused["reason"] == "ForeignObject"
    assert f"Pod '{squatter}' already exists and has no controller" in refused["message"]
    # The Event is its own write, posted after the pass wrote the status: wait for it too.
    kube.wait_for(lambda: any(reason == "PodCreateFailed" and "has no controller" in message
                              for _, reason, message in events(kube, job)),
                  what="the PodCreateFailed Event about the foreign pod")
    reads = operator_reads(control_plane, operator.account, squatter, since)
    assert reads >= 1
    kube.create("pods", impostor(job, 5))  # the job's labels: each change of it starts a pass of the job
    for n in range(6):
        kube.patch("pods", f"{job}-impostor-5", {"metadata": {"annotations": {"poke": str(n)}}})
    one_more_pass(kube, job, ["--epochs", "3"])  # after the pokes' passes
    assert operator_reads(control_plane, operator.account, squatter, since) - reads <= 1, \
        "the foreign pod is read again on every pass"
    assert kube.get("pods", squatter)["metadata"].get("ownerReferences") is None
    assert status(kube, job).get("replicas", 0) == 0, "a foreign pod was counted as the job's"
    kube.delete("pods", squatter)  # not the job's: the fixture's clean-up leaves it
