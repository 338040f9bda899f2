"""A pod is the job's only when the job is its controller: copied labels claim nothing.

Real operator against the API emulator. Without the ownerReference rule, a pod that anyone
in the namespace creates with a job's labels is counted in its status, asked for progress,
and deleted by scale-down as if it were a node of the job.
"""
from ddpjob_operator.api import constants as C
from ddpjob_operator.render.common import pod_labels
from ddpjob_sandbox.jobs import make_manifest
from ddpjob_sandbox.readers import events, pod_names, status
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
