"""Rendezvous topology and capacity through the real operator against the API emulator:
whole-group restarts when the c10d store is lost, single-node replacement otherwise, the
store pod's life, pods waiting for capacity, and Kueue labels."""
from __future__ import annotations

from ddpjob_operator.api import constants as C
from ddpjob_sandbox.readers import condition, events, pod_names, status
from ddpjob_sandbox.jobs import make_manifest
from ddpjob_sandbox.scripted import set_running, set_terminated, set_unschedulable

NODES = ["mlp-node-0", "mlp-node-1", "mlp-node-2"]


def pods_by_name(k8s) -> dict[str, dict]:
    return {p["metadata"]["name"]: p for p in k8s.list("pods") if not p["metadata"].get("deletionTimestamp")}


def rdzv_id(pod: dict) -> str:
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    return env["PET_RDZV_ID"]


def generation(pod: dict) -> str:
    return pod["metadata"]["labels"][C.LABEL_RDZV_GENERATION]


def start_running(k8s, names: list[str], body: dict) -> dict[str, dict]:
    k8s.create("ddpjobs", body)
    k8s.wait_for(lambda: set(names) <= set(pod_names(k8s)), what=f"pods {names}")
    for name in names:
        set_running(k8s, name)
    k8s.wait_for(lambda: status(k8s).get("phase") == C.PHASE_RUNNING, what="phase Running")
    return pods_by_name(k8s)


def new_group(k8s, old: dict[str, dict], names: list[str]):
    pods = pods_by_name(k8s)
    fresh = [pods.get(n) for n in names]
    if all(p and p["metadata"]["uid"] != old[n]["metadata"]["uid"] for p, n in zip(fresh, names)):
        return fresh
    return None


def test_losing_the_c10d_store_host_restarts_every_node_once_under_a_new_rendezvous_id(k8s, operator):
    old = start_running(k8s, NODES, make_manifest(replicas=3, elasticPolicy={"rdzvStore": "node"}))
    uid = k8s.get("ddpjobs", "mlp")["metadata"]["uid"]
    assert {rdzv_id(p) for p in old.values()} == {uid}
    set_terminated(k8s, "mlp-node-0", 1)
    fresh = k8s.wait_for(lambda: new_group(k8s, old, NODES), timeout=30, what="all three nodes replaced")
    assert {rdzv_id(p) for p in fresh} == {f"{uid}-1"} and {generation(p) for p in fresh} == {"1"}
    assert (status(k8s)["rendezvousGeneration"], status(k8s)["restarts"]) == (1, 1)
    warnings = [(reason, message) for kind, reason, message in events(k8s) if kind == "Warning"]
    assert [reason for reason, _ in warnings] == [C.REASON_GROUP_RESTART], warnings
    assert "mlp-node-0 (the c10d store host) failed (exit code 1, Error)" in warnings[0][1]


def test_under_etcd_losing_node_0_replaces_only_node_0_under_the_same_id(k8s, operator):
    body = make_manifest(replicas=3, elasticPolicy={"rdzvBackend": "etcd-v3", "rdzvEndpoints": ["etcd:2379"]})
    old = start_running(k8s, NODES, body)
    set_terminated(k8s, "mlp-node-0", 1)
    k8s.wait_for(lambda: (p := pods_by_name(k8s).get("mlp-node-0")) and p["metadata"]["uid"] != old["mlp-node-0"]["metadata"]["uid"],
                 timeout=30, what="mlp-node-0 replaced")
    pods = pods_by_name(k8s)
    assert [pods[n]["metadata"]["uid"] for n in NODES[1:]] == [old[n]["metadata"]["uid"] for n in NODES[1:]]
    assert rdzv_id(pods["mlp-node-0"]) == rdzv_id(old["mlp-node-1"]) and generation(pods["mlp-node-0"]) == "0"
    assert status(k8s).get("rendezvousGeneration") is None and status(k8s)["restarts"] == 1


def test_the_store_pod_is_created_first_and_its_failure_replaces_it_and_restarts_the_group(k8s, operator):
    k8s.create("ddpjobs", make_manifest(replicas=2))  # c10d: the store pod is the default
    k8s.wait_for(lambda: set(pods_by_name(k8s)) == {"mlp-rdzv", "mlp-node-0", "mlp-node-1"}, what="store and nodes")
    assert pod_names(k8s) == ["mlp-node-0", "mlp-node-1"]  # the store pod is not a node
    service = k8s.get("services", "mlp-rdzv")
    assert service["spec"]["selector"][C.LABEL_COMPONENT] == C.COMPONENT_RDZV_STORE
    node = pods_by_name(k8s)["mlp-node-0"]
    env = {e["name"]: e.get("value") for e in node["spec"]["containers"][0]["env"]}
    assert env["PET_RDZV_ENDPOINT"] == f"mlp-rdzv.{k8s.namespace}.svc.cluster.local:29400"
    assert env["PET_RDZV_CONF"].endswith("is_host=false")
    for name in ("mlp-rdzv", "mlp-node-0", "mlp-node-1"):
        set_running(k8s, name)
    k8s.wait_for(lambda: status(k8s).get("phase") == C.PHASE_RUNNING, what="phase Running")
    old = pods_by_name(k8s)

    set_terminated(k8s, "mlp-rdzv", 1)
    names = ["mlp-rdzv", "mlp-node-0", "mlp-node-1"]
    fresh = k8s.wait_for(lambda: new_group(k8s, old, names), timeout=30, what="the store and both nodes replaced")
    assert [generation(p) for p in fresh[1:]] == ["1", "1"]
    assert (status(k8s)["rendezvousGeneration"], status(k8s)["restarts"]) == (1, 1)
    assert [r for kind, r, _ in events(k8s) if kind == "Warning"] == [C.REASON_GROUP_RESTART]


def test_with_the_store_pod_losing_node_0_replaces_only_node_0(k8s, operator):
    k8s.create("ddpjobs", make_manifest(replicas=2))
    k8s.wait_for(lambda: set(pods_by_name(k8s)) == {"mlp-rdzv", "mlp-node-0", "mlp-node-1"}, what="store and nodes")
    for name in ("mlp-rdzv", "mlp-node-0", "mlp-node-1"):
        set_running(k8s, name)
    k8s.wait_for(lambda: status(k8s).get("phase") == C.PHASE_RUNNING, what="phase Running")
    old = pods_by_name(k8s)
    set_terminated(k8s, "mlp-node-0", 1)
    k8s.wait_for(lambda: (p := pods_by_name(k8s).get("mlp-node-0")) and p["metadata"]["uid"] != old["mlp-node-0"]["metadata"]["uid"],
                 timeout=30, what="mlp-node-0 replaced")
    pods = pods_by_name(k8s)
    assert [pods[n]["metadata"]["uid"] for n in ("mlp-rdzv", "mlp-node-1")] == [
        old[n]["metadata"]["uid"] for n in ("mlp-rdzv", "mlp-node-1")]
    assert status(k8s).get("rendezvousGeneration") is None


def test_a_node_waiting_for_capacity_does_not_block_the_job_and_joins_when_scheduled(k8s, operator):
    body = make_manifest(replicas=3, elasticPolicy={"minReplicas": 2, "maxReplicas": 3},
                         scheduling={"pendingTimeoutSeconds": 1})
    k8s.create("ddpjobs", body)
    k8s.wait_for(lambda: set(NODES) <= set(pod_names(k8s)), what="three node pods")
    set_running(k8s, "mlp-node-0")
    set_running(k8s, "mlp-node-1")
    set_unschedulable(k8s, "mlp-node-2")
    k8s.wait_for(lambda: (condition(k8s, C.COND_NODES_UNSCHEDULABLE) or {}).get("status") == "True", timeout=20,
                 what="NodesUnschedulable after the pending timeout (a requeue, no other event)")
    current = status(k8s)
    assert current["phase"] == C.PHASE_RUNNING
    assert (current["desiredReplicas"], current["scheduledReplicas"], current["runningReplicas"]) == (3, 2, 2)
    assert current["unschedulable"] == ["mlp-node-2: Unschedulable: 0/3 nodes are available: 3 Insufficient "
                                        "nvidia.com/gpu."]
    assert "training continues on 2 node(s)" in condition(k8s, C.COND_NODES_UNSCHEDULABLE)["message"]
    assert [r for _, r, _ in events(k8s)].count(C.REASON_UNSCHEDULABLE) == 1

    set_running(k8s, "mlp-node-2")
    k8s.wait_for(lambda: status(k8s).get("runningReplicas") == 3, timeout=20, what="the late node to join")
    k8s.wait_for(lambda: condition(k8s, C.COND_NODES_UNSCHEDULABLE)["status"] == "False", timeout=20,
                 what="NodesUnschedulable cleared")
    assert status(k8s).get("unschedulable") is None
    assert C.REASON_SCHEDULED in [r for _, r, _ in events(k8s)]


def test_a_queue_name_gives_every_node_pod_the_kueue_pod_group_labels(k8s, operator):
    k8s.create("ddpjobs", make_manifest(replicas=2, scheduling={"queueName": "team-a"}))
    k8s.wait_for(lambda: len(pod_names(k8s)) == 2, what="two node pods")
    for pod in (pods_by_name(k8s)[name] for name in pod_names(k8s)):  # the store pod is in no group
        labels, annotations = pod["metadata"]["labels"], pod["metadata"].get("annotations", {})
        assert (labels["kueue.x-k8s.io/queue-name"], labels["kueue.x-k8s.io/pod-group-name"]) == ("team-a", "mlp")
        assert annotations["kueue.x-k8s.io/pod-group-total-count"] == "2"


def test_a_preempted_node_shrinks_the_job_to_min_and_its_replacement_waits_for_capacity(k8s, operator):
    body = make_manifest(replicas=3, elasticPolicy={"minReplicas": 2, "maxReplicas": 3},
                         failurePolicy={"maxRestarts": 0, "backoffSeconds": 0}, scheduling={"pendingTimeoutSeconds": 1})
    old = start_running(k8s, NODES, body)
    k8s.patch("pods", "mlp-node-2", {"status": {"phase": "Failed", "reason": "Preempted", "conditions": [
        {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}],
        "containerStatuses": [{"name": C.CONTAINER_NAME, "state": {"terminated": {"exitCode": 137}}}]}},
        subresource="status")
    k8s.wait_for(lambda: (p := pods_by_name(k8s).get("mlp-node-2")) and p["metadata"]["uid"] != old["mlp-node-2"]["metadata"]["uid"],
                 timeout=30, what="the preempted node's replacement")
    set_unschedulable(k8s, "mlp-node-2", message="0/3 nodes are available: 3 Insufficient nvidia.com/gpu. "
                      "preemption: 0/3 nodes are available: 3 No preemption victims found.")
    k8s.wait_for(lambda: (condition(k8s, C.COND_NODES_UNSCHEDULABLE) or {}).get("status") == "True", timeout=20,
                 what="the replacement reported as waiting for capacity")
    current = status(k8s)
    assert (current["phase"], current["runningReplicas"], current.get("restarts", 0)) == (C.PHASE_RUNNING, 2, 0)
    assert "No preemption victims found" in current["unschedulable"][0]
