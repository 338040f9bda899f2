"""The job's NetworkPolicy (render/network_policy.py, planned by plan.py): pure, with exact dicts.

Every rendezvous topology gets the same policy, because it selects the job's pods by the
labels all of them carry and admits the job's node pods on every port (DDP's ports are
random): what changes between topologies is which pods exist, and the tests check that
each of them is covered. A small evaluator (tests/support/network_policy.py) reads the
rules as a network plugin would, so the tests state who gets in, not only the dict: no network
plugin runs in the sandbox, and the API server only validates the policy
(tests/cluster/test_network_policy_on_apiserver.py).
"""
from __future__ import annotations

import pytest

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.validation import parse_spec
from ddpjob_operator.controller import main
from ddpjob_operator.decide.actions import CreateNetworkPolicy
from ddpjob_operator.decide.observed import Observed, ObservedPolicy
from ddpjob_operator.decide.reconcile import reconcile
from ddpjob_operator.render.etcd_pod import render_etcd_pod
from ddpjob_operator.render.network_policy import OperatorPeer, render_network_policy
from ddpjob_operator.render.node_pod import render_pod
from ddpjob_operator.render.store_pod import render_store_pod
from tests.operator.builders import at, job_ref
from ddpjob_sandbox.jobs import make_ddpjob
from tests.support.network_policy import admitted, selects

OPERATOR = OperatorPeer(((C.LABEL_APP_NAME, "ddpjob-operator"), (C.LABEL_INSTANCE, "ddpjob-operator")),
                        "ddpjob-system")
OWNER = {"apiVersion": "ddpjob.io/v1alpha1", "kind": "DDPJob", "name": "mlp", "uid": "uid-mlp",
         "controller": True, "blockOwnerDeletion": True}
EXPECTED = {
    "apiVersion": "networking.k8s.io/v1",
    "kind": "NetworkPolicy",
    "metadata": {
        "name": "mlp", "namespace": "team-a", "ownerReferences": [OWNER],
        "labels": {"app.kubernetes.io/name": "ddpjob", "app.kubernetes.io/instance": "mlp",
                   "app.kubernetes.io/managed-by": "ddpjob-operator", "ddpjob.io/job-name": "mlp"},
    },
    "spec": {
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "ddpjob", "app.kubernetes.io/instance": "mlp",
                                        "app.kubernetes.io/managed-by": "ddpjob-operator"}},
        "policyTypes": ["Ingress"],
        "ingress": [
            {"from": [{"podSelector": {"matchLabels": {"ddpjob.io/job-name": "mlp",
                                                       "app.kubernetes.io/component": "node"}}}]},
            {"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ddpjob-system"}},
                       "podSelector": {"matchLabels": {"app.kubernetes.io/name": "ddpjob-operator",
                                                       "app.kubernetes.io/instance": "ddpjob-operator"}}}],
             "ports": [{"protocol": "TCP", "port": 29410}]},
        ],
    },
}
TOPOLOGIES = {
    "c10d store pod": {},
    "c10d store on node 0": {"rdzvStore": "node"},
    "managed etcd": {"rdzvBackend": "etcd-v3", "managedEtcd": {"enabled": True}},
    "etcd-v3 external": {"rdzvBackend": "etcd-v3", "rdzvEndpoints": ["etcd-0.etcd:2379"]},
}


def job(elastic: dict | None = None, **fields) -> dict:
    return make_ddpjob(namespace="team-a", replicas=2, elasticPolicy=elastic or {}, **fields)


def planned_policies(body: dict, exists: bool | None = False) -> list[dict]:
    """The policies reconcile creates when the job's own exists (True), does not (False) or may not be read (None)."""
    state = {True: ObservedPolicy(C.POLICY_PRESENT, EXPECTED["spec"]), False: ObservedPolicy(C.POLICY_ABSENT),
             None: ObservedPolicy(C.POLICY_UNREADABLE)}[exists]
    observed = Observed(network_policy=state)
    actions = reconcile(body, observed, at(0), operator=OPERATOR).actions
    return [a.body for a in actions if isinstance(a, CreateNetworkPolicy)]


def pods_of(body: dict) -> dict[str, dict]:
    """Labels of every pod the operator runs for the job, by role."""
    ref, spec = job_ref(body), parse_spec(body["spec"])
    pods = {f"node {i}": render_pod(ref, spec, i) for i in range(2)}
    if spec.elastic_policy.store_on_pod:
        pods["store"] = render_store_pod(ref, spec)
    if spec.elastic_policy.managed_etcd.enabled:
        pods["etcd"] = render_etcd_pod(ref, spec)
    return {role: pod["metadata"]["labels"] for role, pod in pods.items()}


@pytest.mark.parametrize("elastic", TOPOLOGIES.values(), ids=TOPOLOGIES.keys())
def test_every_topology_gets_the_same_exact_policy(elastic):
    assert planned_policies(job(elastic)) == [EXPECTED]


def test_a_job_that_turns_it_off_gets_none():
    assert planned_policies(job(networkPolicy={"enabled": False})) == []


@pytest.mark.parametrize("elastic", TOPOLOGIES.values(), ids=TOPOLOGIES.keys())
def test_the_policy_covers_every_pod_of_the_job_and_admits_only_its_node_pods(elastic):
    body = job(elastic)
    policy, pods = planned_policies(body)[0], pods_of(body)

    assert all(selects(policy, labels, "team-a") for labels in pods.values()), pods
    for role, labels in pods.items():
        # 29400: the c10d store; 2379: etcd; 47123: a MASTER_PORT or NCCL port torch picked at random.
        for port in (29400, 2379, 47123, C.PROGRESS_PORT):
            assert admitted(policy, labels, "team-a", port) is role.startswith("node"), (role, port)


@pytest.mark.parametrize(("who", "labels", "namespace", "port", "allowed"), [
    ("the operator, progress port", dict(OPERATOR.pod_labels), "ddpjob-system", C.PROGRESS_PORT, True),
    ("the operator, store port", dict(OPERATOR.pod_labels), "ddpjob-system", 29400, False),
    ("the operator's labels elsewhere", dict(OPERATOR.pod_labels), "team-b", C.PROGRESS_PORT, False),
    ("a pod of the namespace", {"app": "notebook"}, "team-a", 29400, False),
    ("another job's node pod", {"ddpjob.io/job-name": "other", "app.kubernetes.io/component": "node"}, "team-a",
     29400, False),
    ("a same-named job's node pod in another namespace", {"ddpjob.io/job-name": "mlp",
                                                          "app.kubernetes.io/component": "node"}, "team-b",
     29400, False),
])
def test_from_outside_the_job_only_the_operator_gets_in_and_only_to_the_progress_port(
        who, labels, namespace, port, allowed):
    assert admitted(planned_policies(job())[0], labels, namespace, port) is allowed


def test_a_helm_release_named_like_the_job_is_not_selected():
    release_pod = {"app.kubernetes.io/instance": "mlp", "app.kubernetes.io/name": "ddpjob",
                   "app.kubernetes.io/managed-by": "Helm"}
    assert not selects(planned_policies(job())[0], release_pod, "team-a")


def test_with_the_operators_namespace_unknown_its_pods_are_admitted_from_any_namespace():
    policy = render_network_policy(job_ref(job()), OperatorPeer())

    assert policy["spec"]["ingress"][1]["from"] == [
        {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app.kubernetes.io/name": "ddpjob-operator"}}}]
    assert admitted(policy, {"app.kubernetes.io/name": "ddpjob-operator"}, "anywhere", C.PROGRESS_PORT)


@pytest.mark.parametrize(("exists", "status"), [
    (True, {}),  # created by an earlier pass: create-or-skip, never a duplicate
    (None, {}),  # not looked for (no grant to read NetworkPolicies): nothing is planned
    (False, {"phase": "Suspended"}),
], ids=["exists", "not observed", "suspended"])
def test_no_policy_is_planned_when_it_exists_or_was_not_looked_for(exists, status):
    body = job(status=status, runPolicy={"suspend": status.get("phase") == "Suspended"})
    assert planned_policies(body, exists) == []


def test_an_invalid_spec_gets_no_policy():
    assert planned_policies(job({"minReplicas": 3, "maxReplicas": 2})) == []


# --- the operator's flags that say where its pods are --------------------------------------

def test_the_operator_peer_comes_from_its_flags():
    args = main.parse_args(["--operator-pod-selector", "app.kubernetes.io/name=ops, team=ml",
                            "--operator-namespace", "ops"])
    assert args.operator_peer == OperatorPeer((("app.kubernetes.io/name", "ops"), ("team", "ml")), "ops")


def test_without_a_namespace_flag_the_operator_uses_its_pods_own(tmp_path, monkeypatch):
    own = tmp_path / "namespace"
    own.write_text("ddpjob-system\n")
    monkeypatch.setattr(main, "SERVICE_ACCOUNT_NAMESPACE", own)
    assert main.parse_args([]).operator_peer == OperatorPeer(namespace="ddpjob-system")
    monkeypatch.setattr(main, "SERVICE_ACCOUNT_NAMESPACE", tmp_path / "not-in-a-pod")
    assert main.parse_args([]).operator_peer == OperatorPeer(namespace="")


@pytest.mark.parametrize("selector", ["", "app", "=x", "app=", "a=b,,c"])
def test_a_selector_that_is_not_key_value_pairs_is_refused(selector, capsys):
    with pytest.raises(SystemExit):
        main.parse_args(["--operator-pod-selector", selector])
    assert (f"--operator-pod-selector ({selector!r}) must be KEY=VALUE[,KEY=VALUE...], the labels of the "
            "operator's pods") in capsys.readouterr().err
