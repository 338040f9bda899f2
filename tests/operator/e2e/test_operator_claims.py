"""A pod is the job's only when the job is its controller: copied labels claim nothing.

Real operator against the API emulator. Without the ownerReference rule, a pod that anyone
in the namespace creates with a job's labels is counted in its status, asked for progress,
and deleted by scale-down as if it were a node of the job.
"""
import time

from ddpjob_operator.api import constants as C
from ddpjob_operator.render.common import pod_labels
from ddpjob_sandbox.jobs import make_manifest
from ddpjob_sandbox.readers import condition, events, pod_names, status
from ddpjob_sandbox.scripted import set_running


def impostor(index: int) -> dict:
    """A pod with every label of node `index` of job mlp, and no owner."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"impostor-{index}", "labels": pod_labels("mlp", index)},
            "spec": {"containers": [{"name": C.CONTAINER_NAME, "image": "busybox"}]}}


def test_a_pod_with_the_jobs_labels_but_no_owner_is_neither_counted_nor_deleted(k8s, operator):
    k8s.create("ddpjobs", make_manifest(replicas=1))
    k8s.wait_for(lambda: pod_names(k8s) == ["mlp-node-0"], what="the node pod")
    k8s.create("pods", impostor(5))  # an index above replicas: scale-down would delete a node pod there
    set_running(k8s, "impostor-5")
    set_running(k8s, "mlp-node-0")
    k8s.wait_for(lambda: status(k8s).get("phase") == C.PHASE_RUNNING, what="phase Running")
    k8s.patch("ddpjobs", "mlp", {"spec": {"replicas": 1, "args": ["--epochs", "3"]}})  # one more pass
    k8s.wait_for(lambda: status(k8s).get("observedGeneration") == k8s.get("ddpjobs", "mlp")["metadata"]["generation"],
                 what="a pass over the edited job")

    assert k8s.find("pods", "impostor-5") is not None, "the operator deleted a pod it does not own"
    assert (status(k8s)["replicas"], status(k8s)["readyReplicas"]) == (1, 1)
    assert not any("impostor" in message for _, _, message in events(k8s))


def operator_reads(cluster, name: str) -> int:
    """The operator's reads of pod ``name`` (a LIST by name; the test's own are left out)."""
    return sum(1 for request in list(cluster.emulator)
               if str(request.method.value).upper() == "GET" and request.url.path.endswith("/pods")
               and request.url.query.get("fieldSelector") == f"metadata.name={name}"
               and request.headers.get("User-Agent", "").startswith(C.MANAGED_BY))


def test_a_foreign_pod_bearing_a_node_pods_name_is_reported_on_the_job_and_not_read_every_pass(cluster, k8s, operator):
    squatter = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "mlp-node-0"},
                "spec": {"containers": [{"name": "app", "image": "busybox"}]}}
    k8s.create("pods", squatter)  # before the job: the operator's create of mlp-node-0 meets it (409)
    k8s.create("ddpjobs", make_manifest(replicas=1, elasticPolicy={"rdzvStore": "node"}))
    refused = k8s.wait_for(lambda: (c := condition(k8s, "PodCreateFailed")) and c["status"] == "True" and c,
                           what="PodCreateFailed about the foreign pod")
    assert refused["reason"] == "ForeignObject"
    assert "Pod 'mlp-node-0' already exists and has no controller" in refused["message"]
    # The Event is its own write, posted after the pass wrote the status: wait for it too.
    k8s.wait_for(lambda: any(reason == "PodCreateFailed" and "has no controller" in message
                             for _, reason, message in events(k8s)),
                 what="the PodCreateFailed Event about the foreign pod")

    reads = operator_reads(cluster, "mlp-node-0")
    assert reads >= 1
    k8s.create("pods", impostor(5))  # the job's labels: each change of it starts a pass of the job
    for n in range(6):
        k8s.patch("pods", "impostor-5", {"metadata": {"annotations": {"poke": str(n)}}})
        time.sleep(0.2)
    assert operator_reads(cluster, "mlp-node-0") - reads <= 1, "the foreign pod is read again on every pass"
    assert k8s.get("pods", "mlp-node-0")["metadata"].get("ownerReferences") is None
    assert status(k8s).get("replicas", 0) == 0, "a foreign pod was counted as the job's"
