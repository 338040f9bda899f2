"""Rendezvous topology and capacity through the helm-installed operator on the real control plane:
whole-group restarts when the c10d store is lost, single-node replacement otherwise, the store
pod's life, pods the real scheduler cannot place (and places once a Node has room), topology
spread honoured by the scheduler, and Kueue labels."""
from __future__ import annotations

import contextlib

import pytest

from ddpjob_operator.api import constants as C
from ddpjob_sandbox.readers import condition, events, pod_names, status, wait_for_event
from ddpjob_sandbox.scripted import set_running, set_terminated
from tests.cluster.operators import fail_store, status_manifest, store_running

pytestmark = pytest.mark.cluster

# Each status-only Node has 4 CPUs: pods asking for 3 take a Node each.
WHOLE_NODE = {"requests": {"cpu": "3"}}


def node_names(job: str, count: int = 3) -> list[str]:
    return [f"{job}-node-{i}" for i in range(count)]


def pods_by_name(kube) -> dict[str, dict]:
    return {p["metadata"]["name"]: p for p in kube.list("pods") if not p["metadata"].get("deletionTimestamp")}


def rdzv_id(pod: dict) -> str:
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    return env["PET_RDZV_ID"]


def generation(pod: dict) -> str:
    return pod["metadata"]["labels"][C.LABEL_RDZV_GENERATION]


def start_running(kube, job: str, names: list[str], body: dict) -> dict[str, dict]:
    kube.create("ddpjobs", body)
    kube.wait_for(lambda: set(names) <= set(pod_names(kube, job)), what=f"pods {names}")
    for name in names:
        set_running(kube, name)
    kube.wait_for(lambda: status(kube, job).get("phase") == C.PHASE_RUNNING, what="phase Running")
    return pods_by_name(kube)


def new_group(kube, old: dict[str, dict], names: list[str]):
    pods = pods_by_name(kube)
    fresh = [pods.get(n) for n in names]
    if all(p and p["metadata"]["uid"] != old[n]["metadata"]["uid"] for p, n in zip(fresh, names)):
        return fresh
    return None


@contextlib.contextmanager
def labelled(kube, nodes, label: str):
    """``label`` on ``nodes`` (more added by the caller through the yielded function), removed after."""
    marked = set()

    def add(*names):
        for name in names:
            kube.patch("nodes", name, {"metadata": {"labels": {label: "true"}}})
            marked.add(name)

    def remove(*names):
        for name in names:
            kube.patch("nodes", name, {"metadata": {"labels": {label: None}}})
            marked.discard(name)

    add(*nodes)
    try:
        yield add, remove
    finally:
        remove(*list(marked))


def test_losing_the_c10d_store_host_restarts_every_node_once_under_a_new_rendezvous_id(operator):
    kube, job = operator.kube, operator.job
    names = node_names(job)
    old = start_running(kube, job, names, status_manifest(job, replicas=3, elasticPolicy={"rdzvStore": "node"}))
    uid = kube.get("ddpjobs", job)["metadata"]["uid"]
    assert {rdzv_id(old[n]) for n in names} == {uid}
    set_terminated(kube, names[0], 1)
    fresh = kube.wait_for(lambda: new_group(kube, old, names), timeout=30, what="all three nodes replaced")
    assert {rdzv_id(p) for p in fresh} == {f"{uid}-1"} and {generation(p) for p in fresh} == {"1"}
    assert (status(kube, job)["rendezvousGeneration"], status(kube, job)["restarts"]) == (1, 1)
    wait_for_event(kube, C.REASON_GROUP_RESTART, timeout=10, job=job)  # posted after the pass's writes
    warnings = [(reason, message) for kind, reason, message in events(kube, job) if kind == "Warning"]
    assert [reason for reason, _ in warnings] == [C.REASON_GROUP_RESTART], warnings
    assert f"{names[0]} (the c10d store host) failed (exit code 1, Error)" in warnings[0][1]


def test_under_etcd_losing_node_0_replaces_only_node_0_under_the_same_id(operator):
    kube, job = operator.kube, operator.job
    names = node_names(job)
    body = status_manifest(job, replicas=3, elasticPolicy={"rdzvBackend": "etcd-v3", "rdzvEndpoints": ["etcd:2379"]})
    old = start_running(kube, job, names, body)
    set_terminated(kube, names[0], 1)
    kube.wait_for(lambda: (p := pods_by_name(kube).get(names[0])) and p["metadata"]["uid"] != old[names[0]]["metadata"]["uid"],
                  timeout=30, what=f"{names[0]} replaced")
    pods = pods_by_name(kube)
    assert [pods[n]["metadata"]["uid"] for n in names[1:]] == [old[n]["metadata"]["uid"] for n in names[1:]]
    assert rdzv_id(pods[names[0]]) == rdzv_id(old[names[1]]) and generation(pods[names[0]]) == "0"
    assert status(kube, job).get("rendezvousGeneration") is None and status(kube, job)["restarts"] == 1


def test_the_store_pod_is_created_first_and_its_failure_replaces_it_and_restarts_the_group(operator):
    kube, job = operator.kube, operator.job
    store, names = f"{job}-rdzv", node_names(job, 2)
    kube.create("ddpjobs", status_manifest(job, replicas=2, elasticPolicy={"rdzvStore": "pod"}))
    kube.wait_for(lambda: {store, *names} <= set(pods_by_name(kube)), what="store and nodes")
    assert pod_names(kube, job) == names  # the store pod is not a node
    service = kube.get("services", store)
    assert service["spec"]["selector"][C.LABEL_COMPONENT] == C.COMPONENT_RDZV_STORE
    env = {e["name"]: e.get("value") for e in pods_by_name(kube)[names[0]]["spec"]["containers"][0]["env"]}
    assert env["PET_RDZV_ENDPOINT"] == f"{store}.{kube.namespace}.svc.cluster.local:29400"
    assert env["PET_RDZV_CONF"].endswith("is_host=false")
    store_running(operator, store)
    for name in names:
        set_running(kube, name)
    kube.wait_for(lambda: status(kube, job).get("phase") == C.PHASE_RUNNING, what="phase Running")
    old = pods_by_name(kube)

    fail_store(operator, store)
    group = [store, *names]
    fresh = kube.wait_for(lambda: new_group(kube, old, group), timeout=60, what="the store and both nodes replaced")
    assert [generation(p) for p in fresh[1:]] == ["1", "1"]
    assert (status(kube, job)["rendezvousGeneration"], status(kube, job)["restarts"]) == (1, 1)
    wait_for_event(kube, C.REASON_GROUP_RESTART, timeout=10, job=job)
    assert [r for kind, r, _ in events(kube, job) if kind == "Warning"] == [C.REASON_GROUP_RESTART]


def test_with_the_store_pod_losing_node_0_replaces_only_node_0(operator):
    kube, job = operator.kube, operator.job
    store, names = f"{job}-rdzv", node_names(job, 2)
    kube.create("ddpjobs", status_manifest(job, replicas=2, elasticPolicy={"rdzvStore": "pod"}))
    kube.wait_for(lambda: {store, *names} <= set(pods_by_name(kube)), what="store and nodes")
    store_running(operator, store)
    for name in names:
        set_running(kube, name)
    kube.wait_for(lambda: status(kube, job).get("phase") == C.PHASE_RUNNING, what="phase Running")
    old = pods_by_name(kube)
    set_terminated(kube, names[0], 1)
    kube.wait_for(lambda: (p := pods_by_name(kube).get(names[0])) and p["metadata"]["uid"] != old[names[0]]["metadata"]["uid"],
                  timeout=30, what=f"{names[0]} replaced")
    pods = pods_by_name(kube)
    assert [pods[n]["metadata"]["uid"] for n in (store, names[1])] == [old[n]["metadata"]["uid"] for n in (store, names[1])]
    assert status(kube, job).get("rendezvousGeneration") is None


def placed(kube, names: list[str]) -> dict[str, str] | None:
    pods = pods_by_name(kube)
    nodes = {n: (pods.get(n) or {}).get("spec", {}).get("nodeName") for n in names}
    return nodes if all(nodes.values()) else None


def scheduler_message(kube, pod: str) -> str | None:
    """The real scheduler's PodScheduled=False message of ``pod``, once it wrote one."""
    conditions = (kube.get("pods", pod).get("status") or {}).get("conditions") or []
    return next((c.get("message") for c in conditions if c["type"] == "PodScheduled" and c["status"] == "False"), None)


def test_a_node_waiting_for_capacity_does_not_block_the_job_and_joins_when_scheduled(operator, status_nodes):
    kube, job = operator.kube, operator.job
    names, label = node_names(job), f"ddpjob.io/test-{job}"
    first_two, last = [n.name for n in status_nodes[:2]], status_nodes[2].name
    with labelled(kube, first_two, label) as (add, _):
        # Three pods that take a whole Node each, on the two Nodes labelled for this test: the real
        # scheduler places two and reports the third unschedulable.
        # The store in a pod of its own: whichever node pod the scheduler leaves waiting (node 0
        # too), the two others can train.
        body = status_manifest(job, replicas=3, elasticPolicy={"minReplicas": 2, "maxReplicas": 3, "rdzvStore": "pod"},
                               resources=WHOLE_NODE, scheduling={"pendingTimeoutSeconds": 1, "nodeSelector": {label: "true"}})
        kube.create("ddpjobs", body)
        store_running(operator, f"{job}-rdzv")
        kube.wait_for(lambda: set(names) <= set(pod_names(kube, job)), what="three node pods")
        waiting = kube.wait_for(lambda: [n for n in names if scheduler_message(kube, n)], timeout=30,
                                what="the scheduler reporting one pod unschedulable")
        assert len(waiting) == 1, waiting
        [late] = waiting
        running = [n for n in names if n != late]
        kube.wait_for(lambda: placed(kube, running), timeout=30, what="the scheduler placing the other two")
        for name in running:
            set_running(kube, name)
        # The real scheduler reports the late pod before the test reports the others running, so
        # the pass that first writes NodesUnschedulable may not have seen them run yet: wait for both.
        kube.wait_for(lambda: (condition(kube, C.COND_NODES_UNSCHEDULABLE, job) or {}).get("status") == "True"
                      and status(kube, job).get("phase") == C.PHASE_RUNNING, timeout=20,
                      what="NodesUnschedulable after the pending timeout (a requeue, no other event), the job running")
        current = status(kube, job)
        assert current["phase"] == C.PHASE_RUNNING, (late, [(c["type"], c["status"], c.get("message")) for c in current["conditions"]], {k: v for k, v in current.items() if k != "conditions"})
        assert (current["desiredReplicas"], current["scheduledReplicas"], current["runningReplicas"]) == (3, 2, 2)
        [entry] = current["unschedulable"]
        assert entry.startswith(f"{late}: Unschedulable: 0/") and "Insufficient cpu" in entry, entry
        assert "training continues on 2 node(s)" in condition(kube, C.COND_NODES_UNSCHEDULABLE, job)["message"]
        wait_for_event(kube, C.REASON_UNSCHEDULABLE, timeout=10, job=job)
        assert [r for _, r, _ in events(kube, job)].count(C.REASON_UNSCHEDULABLE) == 1

        add(last)  # capacity came: the scheduler places the waiting pod on the third Node
        assert kube.wait_for(lambda: placed(kube, [late]), timeout=30, what="the late pod placed") == {late: last}
        set_running(kube, late)
        kube.wait_for(lambda: status(kube, job).get("runningReplicas") == 3, timeout=20, what="the late node to join")
        kube.wait_for(lambda: condition(kube, C.COND_NODES_UNSCHEDULABLE, job)["status"] == "False", timeout=20,
                      what="NodesUnschedulable cleared")
        assert status(kube, job).get("unschedulable") is None
        wait_for_event(kube, C.REASON_SCHEDULED, timeout=10, job=job)


def test_topology_spread_is_honoured_by_the_scheduler(operator, status_nodes):
    kube, job = operator.kube, operator.job
    names = node_names(job)
    spread = [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule"}]
    kube.create("ddpjobs", status_manifest(job, replicas=3, scheduling={"topologySpreadConstraints": spread}))
    kube.wait_for(lambda: set(names) <= set(pod_names(kube, job)), what="three node pods")
    nodes = kube.wait_for(lambda: placed(kube, names), timeout=30, what="the scheduler placing the three pods")
    # The constraint as rendered counts this job's node pods; over three eligible Nodes a skew of
    # at most 1 puts one pod on each.
    assert sorted(nodes.values()) == sorted(n.name for n in status_nodes), nodes


def test_a_queue_name_gives_every_node_pod_the_kueue_pod_group_labels(operator):
    kube, job = operator.kube, operator.job
    kube.create("ddpjobs", status_manifest(job, replicas=2, scheduling={"queueName": "team-a"}))
    kube.wait_for(lambda: len(pod_names(kube, job)) == 2, what="two node pods")
    for pod in (pods_by_name(kube)[name] for name in pod_names(kube, job)):
        labels, annotations = pod["metadata"]["labels"], pod["metadata"].get("annotations", {})
        assert (labels["kueue.x-k8s.io/queue-name"], labels["kueue.x-k8s.io/pod-group-name"]) == ("team-a", job)
        assert annotations["kueue.x-k8s.io/pod-group-total-count"] == "2"


def test_a_preempted_node_shrinks_the_job_to_min_and_its_replacement_waits_for_capacity(operator, status_nodes):
    kube, job = operator.kube, operator.job
    names, label = node_names(job), f"ddpjob.io/test-{job}"
    with labelled(kube, [n.name for n in status_nodes], label) as (_, remove):
        body = status_manifest(job, replicas=3, elasticPolicy={"minReplicas": 2, "maxReplicas": 3}, resources=WHOLE_NODE,
                               failurePolicy={"maxRestarts": 0, "backoffSeconds": 0},
                               scheduling={"pendingTimeoutSeconds": 1, "nodeSelector": {label: "true"}})
        kube.create("ddpjobs", body)
        kube.wait_for(lambda: set(names) <= set(pod_names(kube, job)), what="three node pods")
        nodes = kube.wait_for(lambda: placed(kube, names), timeout=30, what="the scheduler placing the three pods")
        for name in names:
            set_running(kube, name)
        kube.wait_for(lambda: status(kube, job).get("phase") == C.PHASE_RUNNING, what="phase Running")
        old = pods_by_name(kube)
        remove(nodes[names[2]])  # the preemptor holds that Node: the replacement finds no room
        kube.patch("pods", names[2], {"status": {"phase": "Failed", "reason": "Preempted", "conditions": [
            {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}],
            "containerStatuses": [{"name": C.CONTAINER_NAME, "image": "sandbox", "imageID": "", "ready": False,
                                   "restartCount": 0, "state": {"terminated": {"exitCode": 137}}}]}},
            subresource="status")
        kube.wait_for(lambda: (p := pods_by_name(kube).get(names[2])) and p["metadata"]["uid"] != old[names[2]]["metadata"]["uid"],
                      timeout=30, what="the preempted node's replacement")
        kube.wait_for(lambda: (condition(kube, C.COND_NODES_UNSCHEDULABLE, job) or {}).get("status") == "True",
                      timeout=30, what="the replacement reported as waiting for capacity")
        current = status(kube, job)
        assert (current["phase"], current["runningReplicas"], current.get("restarts", 0)) == (C.PHASE_RUNNING, 2, 0)
        [entry] = current["unschedulable"]
        assert entry.startswith(f"{names[2]}: Unschedulable: 0/") and "preemption:" in entry, entry
