"""The real operator runs with exactly the chart's RBAC: every request it needs is allowed, every grant is used,
and what an opt-out value withholds is refused and handled.

The operator runs with the exact arguments the chart's Deployment renders,
against the API emulator (tests/support), which enforces the rendered
ClusterRoles and Roles (tests/support/rbac.py: 403 for anything they do not
grant, as a cluster would), through a job's whole life: create, run (its NetworkPolicy looked for and created), a node
failure and its replacement, scale up, success, pod cleanup and deletion after
ttlSecondsAfterFinished, a pod stuck terminating on a NotReady node
(force-deleted after reading its Node, or left alone without rbac.readNodes),
an etcd-v3 job (a real etcd) whose rendezvous keys are deleted with the
credentials of its Secret (or skipped with a Warning without
rbac.readSecrets), and a job with a managed etcd. Each request the operator
sent (told apart from the test's own by User-Agent) is an RBAC attribute (verb,
API group, resource, namespace); the refused ones must be exactly those the
mode withholds, and every grant must be used by some request.
"""
from __future__ import annotations

import contextlib
import sys
import time

import pytest
import yaml

from ddpjob_operator.controller import etcd_cleanup
from tests.charts.support import CHART_DIR, one, render
from ddpjob_sandbox.etcd import running_etcd
from ddpjob_sandbox.scripted import bind, set_node, set_running, set_terminated
from ddpjob_sandbox.jobs import make_manifest
from ddpjob_sandbox.readers import events, pod_names, status
from ddpjob_sandbox.client import ApiError
from ddpjob_sandbox.operator_process import OperatorProcess
from ddpjob_sandbox.procs import free_port
from tests.support.rbac import TEST_AGENTS, Access, Authorizer, access_of, grants_of

PEERING_CRDS = CHART_DIR / "crds" / "kopf-peerings.yaml"

# Grants no request shows: the API server checks them on other requests.
NOT_OBSERVABLE = {
    # Setting blockOwnerDeletion on a pod's ownerReference (OwnerReferencesPermissionEnforcement).
    ("update", "ddpjob.io", "ddpjobs/finalizers"),
}


def operator_accesses(emulator) -> set[Access]:
    accesses = set()
    for request in list(emulator):
        agent = request.headers.get("User-Agent", "")
        if agent.startswith(TEST_AGENTS):
            continue
        access = access_of(str(request.method.value).upper(), str(request.url))
        if access is not None:
            accesses.add(access)
    return accesses


def chart_args(values: dict) -> list[str]:
    container = one(render(values), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    return [*container["command"][1:], *container["args"]]


def run_etcd_job(k8s, endpoint: str, may_read_secrets: bool) -> None:
    """An etcd-v3 job with a credentials Secret: finishes (its keys are deleted, or the cleanup is
    skipped with a Warning when the Secret may not be read), then is deleted (finalizer)."""
    k8s.request("POST", f"/api/v1/namespaces/{k8s.namespace}/secrets", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "etcd-client"}, "data": {}})
    k8s.create("ddpjobs", make_manifest(name="etcd", replicas=1, elasticPolicy={
        "rdzvBackend": "etcd-v3", "rdzvEndpoints": [endpoint], "rdzvSecretName": "etcd-client"}))
    k8s.wait_for(lambda: pod_names(k8s, "etcd") == ["etcd-node-0"], timeout=20, what="the etcd job's pod")
    set_terminated(k8s, "etcd-node-0", 0)
    if may_read_secrets:
        k8s.wait_for(lambda: cleanup_events(k8s, etcd_cleanup.REASON_CLEANED), timeout=20,
                     what="the etcd job's keys deleted")
    else:
        [warning] = k8s.wait_for(lambda: cleanup_events(k8s, etcd_cleanup.REASON_CLEANUP_FAILED), timeout=20,
                                 what="a Warning that the cleanup was skipped")
        assert "set the chart value rbac.readSecrets=true to let it" in warning, warning
    k8s.delete("ddpjobs", "etcd")
    k8s.wait_for(lambda: k8s.find("ddpjobs", "etcd") is None, timeout=20, what="the etcd job deleted")


def cleanup_events(k8s, reason: str) -> list[str]:
    return [message for _, r, message in events(k8s, "etcd") if r == reason]


def run_managed_etcd_job(k8s) -> None:
    """A job with its own etcd: pod and Service created, the pod deleted when the job finishes."""
    k8s.create("ddpjobs", make_manifest(name="own", replicas=1, elasticPolicy={
        "rdzvBackend": "etcd-v3", "managedEtcd": {"enabled": True}}))
    k8s.wait_for(lambda: k8s.find("pods", "own-etcd") and pod_names(k8s, "own") == ["own-node-0"],
                 timeout=20, what="the managed etcd and the node pod")
    set_terminated(k8s, "own-node-0", 0)
    k8s.wait_for(lambda: k8s.find("pods", "own-etcd") is None, timeout=20, what="the managed etcd deleted")


def run_stuck_pod(cluster, k8s, process, may_read_nodes: bool) -> None:  # noqa: F811
    """A pod stuck terminating on a NotReady node: the operator reads the Node and force-deletes it,
    or, when it may not read Nodes, says so in its log and leaves the pod to its node."""
    cluster.emulator.graceful_pod_deletion = True
    k8s.create("ddpjobs", make_manifest(name="stuck", replicas=1,
                                        failurePolicy={"forceDeleteTerminatingAfterSeconds": 0}))
    k8s.wait_for(lambda: pod_names(k8s, "stuck") == ["stuck-node-0"], timeout=20, what="the stuck job's pod")
    set_node(k8s, "gone-a", ready=False)
    bind(k8s, "stuck-node-0", "gone-a")
    old = k8s.get("pods", "stuck-node-0")["metadata"]["uid"]
    k8s.delete("pods", "stuck-node-0", gracePeriodSeconds=1)
    if may_read_nodes:
        k8s.wait_for(lambda: (p := k8s.find("pods", "stuck-node-0")) and p["metadata"]["uid"] != old, timeout=20,
                     what="the stuck pod force-deleted and created again")
    else:
        k8s.wait_for(lambda: "Cannot read node gone-a" in process.log(), timeout=20,
                     what="the operator to log that it may not read the node")
        assert k8s.get("pods", "stuck-node-0")["metadata"]["uid"] == old, "force-deleted without reading its node"
        k8s.delete("pods", "stuck-node-0", gracePeriodSeconds=0)  # the kubelet's confirmation
    cluster.emulator.graceful_pod_deletion = False


def run_disruption_budget(k8s) -> None:
    """A job's PodDisruptionBudget: created, patched when the job grows, deleted when turned off."""
    k8s.create("ddpjobs", make_manifest(name="pdb", replicas=1, elasticPolicy={"minReplicas": 1, "maxReplicas": 3}))
    k8s.wait_for(lambda: k8s.find("poddisruptionbudgets", "pdb"), timeout=20, what="the job's budget")
    k8s.patch("ddpjobs", "pdb", {"spec": {"replicas": 2}})
    k8s.wait_for(lambda: pod_names(k8s, "pdb") == ["pdb-node-0", "pdb-node-1"], timeout=20, what="two node pods")
    for name in ["pdb-rdzv", "pdb-node-0", "pdb-node-1"]:  # the budget follows the Ready pods (render/pdb.py)
        set_running(k8s, name)
    k8s.wait_for(lambda: k8s.get("poddisruptionbudgets", "pdb")["spec"]["minAvailable"] == 2, timeout=20,
                 what="the budget patched after the scale")
    k8s.patch("ddpjobs", "pdb", {"spec": {"runPolicy": {"podDisruptionBudget": False}}})
    k8s.wait_for(lambda: k8s.find("poddisruptionbudgets", "pdb") is None, timeout=20,
                 what="the budget deleted when turned off")
    k8s.delete("ddpjobs", "pdb")


def run_network_policy_repair(k8s) -> None:
    """A job's NetworkPolicy, opened by an edit, is put back."""
    k8s.create("ddpjobs", make_manifest(name="np", replicas=1))
    policy = k8s.wait_for(lambda: k8s.find("networkpolicies", "np"), timeout=20, what="the job's NetworkPolicy")
    k8s.patch("networkpolicies", "np", {"spec": {"ingress": [{}]}})  # admit everyone
    k8s.wait_for(lambda: k8s.get("networkpolicies", "np")["spec"] == policy["spec"], timeout=20,
                 what="the NetworkPolicy put back")
    k8s.delete("ddpjobs", "np")


def run_job_lifecycle(k8s) -> None:
    """Jobs that exercise every operator write: create, replace, scale, succeed, clean up, expire.

    The TTL deletion runs on a second job that had no earlier timer (see the
    report on handlers.Passes.schedule keeping fired timers).
    """
    k8s.create("ddpjobs", make_manifest(replicas=2, elasticPolicy={"minReplicas": 1, "maxReplicas": 3},
                                        runPolicy={"cleanPodPolicy": "All"}))
    k8s.create("ddpjobs", make_manifest(name="ttl", replicas=1, runPolicy={"ttlSecondsAfterFinished": 1}))
    k8s.wait_for(lambda: pod_names(k8s) == ["mlp-node-0", "mlp-node-1"], timeout=20, what="two node pods")
    for name in pod_names(k8s):
        set_running(k8s, name)
    failed_uid = set_terminated(k8s, "mlp-node-1", 1)["metadata"]["uid"]
    k8s.wait_for(lambda: status(k8s).get("restarts") == 1, timeout=15, what="a counted restart")
    k8s.patch("ddpjobs", "mlp", {"spec": {"replicas": 3}})
    k8s.wait_for(lambda: len(pod_names(k8s)) == 3 and k8s.get("pods", "mlp-node-1")["metadata"]["uid"] != failed_uid,
                 timeout=20, what="node 1 replaced and node 2 added")
    for name in pod_names(k8s):
        with contextlib.suppress(ApiError):  # the job may finish and clean up before the last pod reports
            set_terminated(k8s, name, 0)
    k8s.wait_for(lambda: pod_names(k8s) == [], timeout=20, what="cleanPodPolicy All to delete the pods")
    k8s.wait_for(lambda: pod_names(k8s, "ttl") == ["ttl-node-0"], timeout=20, what="the ttl job's pod")
    set_terminated(k8s, "ttl-node-0", 0)
    k8s.wait_for(lambda: k8s.find("ddpjobs", "ttl") is None, timeout=20,
                 what="the finished ttl job deleted after ttlSecondsAfterFinished")


# Each mode: chart values (watch: the test's namespace in watchNamespaces) and what they withhold.
PEERING = {"peering": {"enabled": True}}  # kopf peering: ClusterKopfPeering, or a KopfPeering per namespace
MODES = {
    "all-namespaces": {},
    "all-namespaces-read-secrets-peering": {"rbac": {"readSecrets": True}, **PEERING},
    "watched-namespace": {"watch": True},
    "watched-namespace-read-secrets-no-nodes-peering": {
        "watch": True, "rbac": {"readSecrets": True, "readNodes": False}, **PEERING},
}


def chart_values(mode: str, namespace: str) -> dict:
    values = {key: value for key, value in MODES[mode].items() if key != "watch"}
    if MODES[mode].get("watch"):
        values["watchNamespaces"] = [namespace]
    return {**values, "livenessPort": free_port()}


def install_peering(cluster, k8s, objects: list[dict]) -> None:  # noqa: F811
    """The peering CRDs (chart crds/) and the peering objects the chart renders, as `helm install` would."""
    peerings = [obj for obj in objects if obj["apiVersion"].startswith("kopf.dev/")]
    if not peerings:
        return
    for crd in yaml.safe_load_all(PEERING_CRDS.read_text()):
        cluster.emulator.register_crd(crd)
    for peering in peerings:
        namespace = peering["metadata"].get("namespace")
        where = f"namespaces/{namespace}/kopfpeerings" if namespace else "clusterkopfpeerings"
        k8s.request("POST", f"/apis/kopf.dev/v1/{where}", peering)


@pytest.mark.parametrize("mode", MODES)
def test_the_operator_works_with_exactly_the_chart_rbac_and_uses_every_grant(mode, cluster, k8s,  # noqa: F811
                                                                            tmp_path):
    values = chart_values(mode, k8s.namespace)
    rbac = values.get("rbac", {})
    may_read_secrets, may_read_nodes = rbac.get("readSecrets", False), rbac.get("readNodes", True)
    objects = render(values)
    install_peering(cluster, k8s, objects)
    grants = grants_of(objects)
    cluster.emulator.authorize = authorizer = Authorizer(grants)
    process = OperatorProcess(cluster, [sys.executable, *chart_args(values)], tmp_path / "operator.log")
    with process:
        try:
            run_job_lifecycle(k8s)
            run_disruption_budget(k8s)
            run_network_policy_repair(k8s)
            run_stuck_pod(cluster, k8s, process, may_read_nodes)
            with running_etcd() as etcd:
                run_etcd_job(k8s, etcd.endpoint, may_read_secrets)
            run_managed_etcd_job(k8s)
            time.sleep(0.5)  # let the last status write and event land
        finally:
            sys.stdout.write(f"\n--- operator log ---\n{process.log()[-8000:]}\n")
    assert "Traceback" not in process.log()

    withheld = ({f"get core/secrets in {k8s.namespace}"} if not may_read_secrets else set()) | (
        {"get core/nodes cluster-wide"} if not may_read_nodes else set())
    assert {str(a) for a in authorizer.denied} == withheld, "the operator was refused more than the mode withholds"

    accesses = operator_accesses(cluster.emulator)
    assert accesses, "recorded no operator requests"
    allowed = grants.cluster | set().union(*grants.namespaced.values())
    used = {a.grant for a in accesses if grants.allows(a)} | NOT_OBSERVABLE
    unused = sorted(allowed - used)
    assert unused == [], f"granted but never used by the operator, drop from rbac.yaml: {unused}"
