"""Bad nodes stay bad, with the real operator against the API emulator.

The emulator does not schedule, so the proof is the replacement pod as the operator created
it: its required node affinity keeps it off the node its predecessor was lost with.
"""
from __future__ import annotations

from ddpjob_sandbox.jobs import make_manifest
from ddpjob_sandbox.readers import pod_names, status
from ddpjob_sandbox.scripted import bind, set_disruption_target, set_running

AVOID_BAD = {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["gpu-bad"]}


def required_terms(pod: dict) -> list:
    affinity = pod["spec"].get("affinity") or {}
    return affinity.get("nodeAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution", {}).get(
        "nodeSelectorTerms", [])


def test_a_pod_lost_with_its_node_is_replaced_off_that_node_for_the_rest_of_the_job(k8s, operator):
    k8s.create("ddpjobs", make_manifest(replicas=2, failurePolicy={"backoffSeconds": 0}))
    k8s.wait_for(lambda: pod_names(k8s) == ["mlp-node-0", "mlp-node-1"], timeout=15, what="two node pods")
    for name, node in (("mlp-node-0", "gpu-good"), ("mlp-node-1", "gpu-bad")):
        bind(k8s, name, node)
        set_running(k8s, name)
    old = k8s.get("pods", "mlp-node-1")["metadata"]["uid"]
    set_disruption_target(k8s, "mlp-node-1", reason="DeletionByTaintManager", message="node gpu-bad is gone",
                          exit_code=137)
    replacement = k8s.wait_for(lambda: (p := k8s.find("pods", "mlp-node-1")) and p["metadata"]["uid"] != old and p,
                               timeout=20, what="node 1 replaced")
    assert required_terms(replacement) == [{"matchExpressions": [AVOID_BAD]}]
    [avoided] = status(k8s)["avoidedNodes"]
    assert (avoided["node"], avoided["cause"]) == ("gpu-bad", "NodeLost")
    assert status(k8s)["failures"][-1]["node"] == "gpu-bad"
    assert required_terms(k8s.get("pods", "mlp-node-0")) == []  # a pod that was not replaced is left as it is
