"""Rendered objects of a good cluster citizen: the PodDisruptionBudget, topology spread and the
anti-affinity to avoided nodes (pure, docs/cluster.md)."""
from __future__ import annotations

import pytest

from ddpjob_operator.api.validation import parse_spec, validate_job
from ddpjob_operator.render.node_pod import avoiding_nodes, render_pod
from ddpjob_operator.render.pdb import render_disruption_budget
from ddpjob_sandbox.jobs import make_ddpjob
from tests.operator.builders import job_ref


def budget(**fields) -> dict:
    job = make_ddpjob(**fields)
    return render_disruption_budget(job_ref(job), parse_spec(job["spec"]))


@pytest.mark.parametrize("fields,min_available", [
    ({"replicas": 3}, 2 + 1),  # not elastic: one node pod at a time may go; + the store pod
    ({"replicas": 4, "min_replicas": 2, "max_replicas": 6}, 2 + 1),  # elastic: down to minReplicas
    ({"replicas": 2, "min_replicas": 2, "max_replicas": 6}, 1 + 1),  # at its minimum: still one at a time
    ({"replicas": 1}, 0 + 1),  # a one-node job never blocks a drain
    ({"replicas": 3, "elasticPolicy": {"rdzvStore": "node"}}, 2),  # no store pod to count
    ({"replicas": 3, "elasticPolicy": {"rdzvBackend": "etcd-v3", "rdzvEndpoints": ["etcd:2379"]}}, 2),
])
def test_the_budget_lets_a_drain_shrink_a_job_to_its_minimum_and_never_allows_no_eviction(fields, min_available):
    body = budget(**fields)
    assert body["spec"]["minAvailable"] == min_available
    pods = fields.get("replicas") + (1 if "elasticPolicy" not in fields else 0)
    assert pods - body["spec"]["minAvailable"] >= 1  # with every pod healthy, a drain may always evict one


def test_the_budget_covers_node_and_store_pods_is_owned_by_the_job_and_lets_unready_pods_go():
    body = budget(replicas=2)
    assert (body["apiVersion"], body["kind"], body["metadata"]["name"]) == ("policy/v1", "PodDisruptionBudget", "mlp")
    assert body["spec"]["selector"] == {
        "matchLabels": {"ddpjob.io/job-name": "mlp"},
        "matchExpressions": [{"key": "app.kubernetes.io/component", "operator": "In",
                              "values": ["node", "rdzv-store"]}]}
    assert body["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    [owner] = body["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("DDPJob", "mlp", True)


# --- Topology spread ------------------------------------------------------------------------

def pod_spec(job: dict, avoid=()) -> dict:
    return render_pod(job_ref(job), parse_spec(job["spec"]), 0, avoid=avoid)["spec"]


def test_spread_constraints_pass_through_and_count_the_jobs_node_pods_by_default():
    job = make_ddpjob(replicas=4, scheduling={"topologySpreadConstraints": [
        {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule"},
        {"maxSkew": 2, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway",
         "labelSelector": {"matchLabels": {"team": "a"}}, "minDomains": 2, "nodeTaintsPolicy": "Honor"}]})
    assert pod_spec(job)["topologySpreadConstraints"] == [
        {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule",
         "labelSelector": {"matchLabels": {"ddpjob.io/job-name": "mlp", "app.kubernetes.io/component": "node"}}},
        {"maxSkew": 2, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway",
         "labelSelector": {"matchLabels": {"team": "a"}}, "minDomains": 2, "nodeTaintsPolicy": "Honor"}]
    assert "topologySpreadConstraints" not in pod_spec(make_ddpjob(replicas=2))


@pytest.mark.parametrize("constraint,message", [
    ({"maxSkew": 0, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"},
     "spec.scheduling.topologySpreadConstraints[0].maxSkew (0) must be >= 1"),
    ({"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "Sometimes"},
     "spec.scheduling.topologySpreadConstraints[0].whenUnsatisfiable (\"Sometimes\") must be one of "
     "'DoNotSchedule' or 'ScheduleAnyway'"),
    ({"maxSkew": 1, "whenUnsatisfiable": "DoNotSchedule"},
     "spec.scheduling.topologySpreadConstraints[0].topologyKey is required"),
])
def test_a_bad_spread_constraint_is_refused_naming_field_value_and_rule(constraint, message):
    job = make_ddpjob(replicas=2, scheduling={"topologySpreadConstraints": [constraint]})
    assert [e.message for e in validate_job(job)] == [message]


# --- Avoided nodes --------------------------------------------------------------------------

def test_a_replacement_is_kept_off_avoided_nodes_by_a_required_hostname_anti_affinity():
    affinity = pod_spec(make_ddpjob(replicas=2), avoid=["gpu-b", "gpu-a"])["affinity"]
    assert affinity == {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["gpu-a", "gpu-b"]}]}]}}}
    assert "affinity" not in pod_spec(make_ddpjob(replicas=2))


def test_the_anti_affinity_joins_every_term_of_the_users_own_required_affinity():
    avoid = {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["bad"]}
    user = {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a100"]}]},
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]},
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {}}]},
        "podAntiAffinity": {"x": 1}}
    result = avoiding_nodes(user, ["bad"])
    assert result["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a100"]}, avoid]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}], "matchExpressions": [avoid]}]
    assert result["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] == [{"weight": 1, "preference": {}}]
    assert result["podAntiAffinity"] == {"x": 1}
    assert user["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0] == {
        "matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a100"]}]}  # the spec is not changed


def combinations() -> list[tuple[int, int, int, str, int]]:
    """(minReplicas, maxReplicas, replicas, rdzvStore, healthy pods) for every small job and every
    count of its pods Ready, from one up to all of them (the store pod counted as one more)."""
    found = []
    for low in range(1, 5):
        for high in range(low, 7):
            for replicas in range(low, high + 1):
                for store in ("pod", "node"):
                    pods = replicas + (store == "pod")
                    found += [(low, high, replicas, store, healthy) for healthy in range(1, pods + 1)]
    return found


@pytest.mark.parametrize("low,high,replicas,store,healthy", combinations())
def test_the_budget_allows_an_eviction_whatever_the_job_runs_at(low, high, replicas, store, healthy):
    job = make_ddpjob(replicas=replicas, min_replicas=low, max_replicas=high, elasticPolicy={"rdzvStore": store})
    body = render_disruption_budget(job_ref(job), parse_spec(job["spec"]), healthy)
    # The disruption controller's arithmetic: disruptionsAllowed = currentHealthy - minAvailable.
    assert healthy - body["spec"]["minAvailable"] >= 1
    assert body["spec"]["minAvailable"] >= 0


def test_an_elastic_job_at_its_minimum_lets_a_drain_evict_one_and_a_whole_one_keeps_its_floor():
    job = make_ddpjob(replicas=4, min_replicas=2, max_replicas=4)  # 2 running, 2 Pending on a full cluster
    ref, spec = job_ref(job), parse_spec(job["spec"])
    assert render_disruption_budget(ref, spec, 2 + 1)["spec"]["minAvailable"] == 2  # was 2 + 1: nothing allowed
    assert render_disruption_budget(ref, spec, 4 + 1)["spec"]["minAvailable"] == 2 + 1  # down to minReplicas
