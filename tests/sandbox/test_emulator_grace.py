"""The emulator's opt-in pod grace periods and Node objects, which the force-delete tests rely on."""
import pytest

from ddpjob_sandbox.client import ApiError


def pod(name, node=""):
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    if node:
        body["spec"]["nodeName"] = node
    return body


def test_a_bound_pod_waits_for_its_grace_period_and_a_force_delete_removes_it(cluster, k8s):
    cluster.emulator.graceful_pod_deletion = True
    k8s.create("pods", pod("bound", node="n1"))
    k8s.create("pods", pod("unbound"))
    marked = k8s.delete("pods", "bound", gracePeriodSeconds=5)
    assert marked["metadata"]["deletionGracePeriodSeconds"] == 5 and marked["metadata"]["deletionTimestamp"]
    assert k8s.find("pods", "bound")["metadata"]["deletionTimestamp"] == marked["metadata"]["deletionTimestamp"]
    assert k8s.delete("pods", "bound")["metadata"]["deletionTimestamp"] == marked["metadata"]["deletionTimestamp"]
    k8s.delete("pods", "bound", gracePeriodSeconds=0)
    assert k8s.find("pods", "bound") is None
    k8s.delete("pods", "unbound", gracePeriodSeconds=5)  # never scheduled: nothing to wait for
    assert k8s.find("pods", "unbound") is None


def test_without_the_switch_a_bound_pod_goes_at_once(cluster, k8s):
    k8s.create("pods", pod("bound", node="n1"))
    k8s.delete("pods", "bound", gracePeriodSeconds=30)
    assert k8s.find("pods", "bound") is None


def test_nodes_are_cluster_scoped_objects_with_status(k8s):
    k8s.create("nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})
    k8s.patch("nodes", "n1", {"status": {"conditions": [{"type": "Ready", "status": "False"}]}},
              subresource="status")
    node = k8s.get("nodes", "n1")
    assert node["status"]["conditions"][0]["status"] == "False" and "namespace" not in node["metadata"]
    with pytest.raises(ApiError) as missing:
        k8s.get("nodes", "n2")
    assert missing.value.status == 404
