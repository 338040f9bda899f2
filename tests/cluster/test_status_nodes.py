"""Status-only Nodes (the benches' 8,000 pods) on the real API server: registered and renewed as a
kubelet's Node, their bound pods reported Running at the address asked for, deleted pods removed."""
from __future__ import annotations

import time

import pytest

from ddpjob_sandbox.client import KubeClient
from ddpjob_sandbox.control_plane import ControlPlane
from ddpjob_sandbox.control_plane.nodes import LEASE_NAMESPACE
from ddpjob_sandbox.control_plane.status_nodes import CAPACITY, STATUS_NODE_LABEL, running_status_nodes
from tests.cluster.sandbox_only import NODE_IDENTITIES

pytestmark = [pytest.mark.cluster, pytest.mark.sandbox_only(NODE_IDENTITIES)]

NAMES = ["status-a", "status-b"]
ADDRESS = "127.9.9.9"


@pytest.fixture(scope="module")
def status_nodes(control_plane: ControlPlane):
    with running_status_nodes(control_plane.layout, NAMES, heartbeat_seconds=1.0,
                              pod_ip=lambda pod: ADDRESS) as running:
        yield running


def pod_body(name: str, node: str) -> dict:
    return {"metadata": {"name": name}, "spec": {
        "nodeSelector": {STATUS_NODE_LABEL: "true", "kubernetes.io/hostname": node},
        "containers": [{"name": "trainer", "image": "busybox"}]}}


def test_a_status_node_registers_ready_with_its_capacity_and_label(status_nodes, kube: KubeClient):
    for name in NAMES:
        node = kube.get("nodes", name)
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert [c["status"] for c in ready] == ["True"], node["status"]
        assert node["status"]["allocatable"] == CAPACITY
        assert node["metadata"]["labels"][STATUS_NODE_LABEL] == "true"


def test_a_status_node_renews_its_lease(status_nodes, kube: KubeClient):
    first = {n: kube.get("leases", n, namespace=LEASE_NAMESPACE)["spec"] for n in NAMES}
    assert {n: s["holderIdentity"] for n, s in first.items()} == {n: n for n in NAMES}
    time.sleep(2.5)  # two heartbeats
    later = {n: kube.get("leases", n, namespace=LEASE_NAMESPACE)["spec"]["renewTime"] for n in NAMES}
    assert all(later[n] > first[n]["renewTime"] for n in NAMES), (first, later)
    assert all(node.node.errors == [] for node in status_nodes)


def test_a_bound_pod_is_reported_running_at_the_given_address_and_runs_nothing(status_nodes, kube: KubeClient):
    kube.create("pods", pod_body("bound", "status-b"))
    pod = kube.wait_for(lambda: (p := kube.get("pods", "bound")).get("status", {}).get("phase") == "Running" and p,
                        timeout=60, what="pod bound reported Running")
    assert pod["spec"]["nodeName"] == "status-b"
    assert (pod["status"]["podIP"], pod["status"]["containerStatuses"][0]["name"]) == (ADDRESS, "trainer")
    assert pod["status"]["containerStatuses"][0]["state"]["running"]["startedAt"]
    # The node notes what it reported once its PATCH returned: this test may see the API first.
    kube.wait_for(lambda: any("bound" in n.reported.values() for n in status_nodes), timeout=10,
                  what="a status node noting its report of pod bound")
    by_node = {n.name: set(n.reported.values()) for n in status_nodes}
    assert "bound" in by_node["status-b"] and "bound" not in by_node["status-a"]
    assert all(n.errors == [] for n in status_nodes), [n.errors for n in status_nodes]


def test_a_deleted_pod_is_removed_for_good_as_a_kubelet_confirms_it(status_nodes, kube: KubeClient):
    kube.create("pods", pod_body("doomed", "status-a"))
    kube.wait_for(lambda: kube.get("pods", "doomed").get("status", {}).get("phase") == "Running", timeout=60,
                  what="pod doomed reported Running")
    kube.delete("pods", "doomed")  # graceful: without the node's confirmation it would stay Terminating
    kube.wait_for(lambda: kube.find("pods", "doomed") is None, timeout=30, what="pod doomed gone")
