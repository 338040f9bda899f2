"""Three Nodes registered and kept Ready against the real API server, each as its own kubelet identity."""
from __future__ import annotations

import time

import pytest

from ddpjob_sandbox.client import ApiError, KubeClient
from ddpjob_sandbox.control_plane import ControlPlane
from ddpjob_sandbox.control_plane.nodes import LEASE_NAMESPACE, running_nodes
from tests.cluster.sandbox_only import NODE_IDENTITIES

pytestmark = [pytest.mark.cluster, pytest.mark.sandbox_only(NODE_IDENTITIES)]

NAMES = ["node-a", "node-b", "node-c"]


@pytest.fixture(scope="module")
def nodes(control_plane: ControlPlane):
    with running_nodes(control_plane.layout, NAMES, labels={"ddpjob.io/sandbox": "true"},
                       heartbeat_seconds=1.0) as running:
        yield running


def ready(node: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions", []))


def test_each_node_is_registered_ready_with_its_capacity_and_labels(nodes, kube: KubeClient):
    for name in NAMES:
        node = kube.get("nodes", name)
        assert ready(node), node["status"]
        assert node["status"]["allocatable"] == {"cpu": "4", "memory": "8Gi", "pods": "110"}
        assert (node["metadata"]["labels"]["kubernetes.io/hostname"], node["metadata"]["labels"]["ddpjob.io/sandbox"]) \
            == (name, "true")


def test_each_node_renews_its_own_lease(nodes, kube: KubeClient):
    first = {n: kube.get("leases", n, namespace=LEASE_NAMESPACE)["spec"] for n in NAMES}
    assert {n: s["holderIdentity"] for n, s in first.items()} == {n: n for n in NAMES}
    time.sleep(2.5)  # two heartbeats
    later = {n: kube.get("leases", n, namespace=LEASE_NAMESPACE)["spec"]["renewTime"] for n in NAMES}
    assert all(later[n] > first[n]["renewTime"] for n in NAMES), (first, later)
    assert all(node.errors == [] for node in nodes)


def test_a_node_may_not_write_another_nodes_object(nodes):
    node_a = nodes[0]
    with pytest.raises(ApiError) as refused:
        node_a.client.patch("nodes", "node-b", {"metadata": {"labels": {"stolen": "yes"}}})
    assert refused.value.status == 403


def test_the_scheduler_binds_pods_to_the_registered_nodes(nodes, kube: KubeClient):
    for i in range(3):
        kube.create("pods", {"metadata": {"name": f"p{i}"}, "spec": {
            "nodeSelector": {"ddpjob.io/sandbox": "true"}, "containers": [{"name": "main", "image": "busybox"}]}})
    bound = kube.wait_for(lambda: all(kube.get("pods", f"p{i}")["spec"].get("nodeName") for i in range(3))
                          and [kube.get("pods", f"p{i}")["spec"]["nodeName"] for i in range(3)],
                          timeout=60, what="the scheduler binding p0..p2")
    assert set(bound) <= set(NAMES)


def test_nodes_leave_the_cluster_when_their_block_ends(control_plane: ControlPlane, kube: KubeClient):
    """A stopped Node left registered stays Ready for the lifecycle controller's grace period, and
    the scheduler would bind the next test's pods to it (a rendezvous store pod waited there for
    good in one CI run): each block deregisters its Nodes."""
    with running_nodes(control_plane.layout, ["node-leaving"], heartbeat_seconds=1.0):
        assert ready(kube.get("nodes", "node-leaving"))
    with pytest.raises(ApiError) as gone:
        kube.get("nodes", "node-leaving")
    assert gone.value.status == 404
