"""Bad nodes stay bad, with the helm-installed operator on the real control plane: the
replacement of a pod lost with its node carries a required node anti-affinity to that node, and
the real scheduler places it elsewhere."""
from __future__ import annotations

import pytest

from ddpjob_sandbox.readers import pod_names, status
from ddpjob_sandbox.scripted import set_disruption_target, set_running
from tests.cluster.operators import status_manifest

pytestmark = pytest.mark.cluster


def required_terms(pod: dict) -> list:
    affinity = pod["spec"].get("affinity") or {}
    return affinity.get("nodeAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution", {}).get(
        "nodeSelectorTerms", [])


def test_a_pod_lost_with_its_node_is_replaced_off_that_node_for_the_rest_of_the_job(operator, status_nodes):
    kube, job = operator.kube, operator.job
    kube.create("ddpjobs", status_manifest(job, replicas=2, failurePolicy={"backoffSeconds": 0}))
    names = [f"{job}-node-0", f"{job}-node-1"]
    kube.wait_for(lambda: pod_names(kube, job) == names, timeout=15, what="two node pods")
    placed = kube.wait_for(lambda: all((n := {p: kube.get("pods", p)["spec"].get("nodeName") for p in names}).values())
                           and n, timeout=30, what="the scheduler placing both pods")
    for name in names:
        set_running(kube, name)
    bad = placed[names[1]]
    old = kube.get("pods", names[1])["metadata"]["uid"]
    set_disruption_target(kube, names[1], reason="DeletionByTaintManager", message=f"node {bad} is gone",
                          exit_code=137)
    replacement = kube.wait_for(lambda: (p := kube.find("pods", names[1])) and p["metadata"]["uid"] != old and p,
                                timeout=20, what="node 1 replaced")
    avoid = {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": [bad]}
    assert required_terms(replacement) == [{"matchExpressions": [avoid]}]
    [avoided] = status(kube, job)["avoidedNodes"]
    assert (avoided["node"], avoided["cause"]) == (bad, "NodeLost")
    assert status(kube, job)["failures"][-1]["node"] == bad
    assert required_terms(kube.get("pods", names[0])) == []  # a pod that was not replaced is left as it is
    # The real scheduler honours it: three status-only Nodes, the replacement on one of the other two.
    node = kube.wait_for(lambda: kube.get("pods", names[1])["spec"].get("nodeName"), timeout=30,
                         what="the scheduler placing the replacement")
    assert node != bad and node in {n.name for n in status_nodes}
