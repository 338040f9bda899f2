"""The helm-installed operator runs with exactly the chart's RBAC, enforced by the real API
server: every request it needs is allowed, every grant is used, and what an opt-out value
withholds is refused (403) and handled. Its requests are read from the audit log by its
ServiceAccount's user (ddpjob_sandbox.control_plane.audit), each an RBAC attribute (verb, API
group, resource with its subresource, namespace); the grants are what the API server's RBAC
authorizer says the ServiceAccount may do in its namespace (tests/cluster/rbac_review.py: a
SelfSubjectRulesReview as that account), so the bindings are evaluated by the server, not by the test.

Through a job's whole life: create, run (its NetworkPolicy looked for, created, put back), a node
failure and its replacement, scale up, success, pod cleanup and deletion after
ttlSecondsAfterFinished, a PodDisruptionBudget created, patched and deleted, a pod stuck terminating
on a NotReady Node (force-deleted after reading its Node, or left alone without rbac.readNodes), an
etcd-v3 job (a real etcd) whose rendezvous keys are deleted with the credentials of its Secret (or
skipped with a Warning without rbac.readSecrets), and a job with a managed etcd.

A control plane of this module's own: two of the modes serve every namespace, and would take up
the DDPJobs other tests of the session left in theirs. Job pods sit on status-only Nodes (the
test writes their status); the operator's pod runs on a kubelet.
"""
from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import pytest

from ddpjob_operator.controller import etcd_cleanup
from ddpjob_sandbox.client import ApiError, KubeClient
from ddpjob_sandbox.control_plane import ControlPlane, audit, running_control_plane
from ddpjob_sandbox.control_plane.kubelets import running_kubelets
from ddpjob_sandbox.control_plane.scripted_nodes import running_status_only_nodes
from ddpjob_sandbox.etcd import running_etcd
from ddpjob_sandbox.readers import events, pod_names, status
from ddpjob_sandbox.scripted import set_node, set_running, set_terminated
from tests.cluster.conftest import HEARTBEAT_SECONDS, NODE_MONITOR_GRACE_SECONDS
from tests.cluster.installed_operator import Installed, installed_operator, wait
from tests.cluster.operators import STATUS_ONLY_NODES, status_manifest
from tests.cluster.rbac_review import Grant, granted
from tests.cluster.sandbox_only import OWN_CONTROL_PLANE

pytestmark = [pytest.mark.cluster, pytest.mark.sandbox_only(OWN_CONTROL_PLANE)]

# Grants no request shows: the API server checks them on other requests.
NOT_OBSERVABLE = {
    # Setting blockOwnerDeletion on a pod's ownerReference (OwnerReferencesPermissionEnforcement).
    ("update", "ddpjob.io", "ddpjobs/finalizers"),
}
STEP_SECONDS = 60  # one pass after a change, on a loaded 2-core machine
NOWHERE = {"ddpjob-test/no-such-node": "true"}  # a nodeSelector no Node matches: the pod waits unbound


@pytest.fixture(scope="module")
def plane(tmp_path_factory) -> Iterator[tuple[ControlPlane, list]]:
    root = tmp_path_factory.mktemp("rbac")
    with running_control_plane(root / "control-plane", node_monitor_grace_seconds=NODE_MONITOR_GRACE_SECONDS) as cp, \
            running_kubelets(cp.layout.pki, cp.url, root / "kubelets", ("rbac-kubelet-0",),
                             heartbeat_seconds=HEARTBEAT_SECONDS, poll_seconds=0.2) as kubelets, \
            running_status_only_nodes(cp.client(), STATUS_ONLY_NODES, heartbeat_seconds=HEARTBEAT_SECONDS):
        yield cp, kubelets


def run_job_lifecycle(installed: Installed) -> None:
    """Jobs that exercise every operator write: create, replace, scale, succeed, clean up, expire."""
    kube = installed.kube
    kube.create("ddpjobs", status_manifest("mlp", replicas=2, elasticPolicy={"minReplicas": 1, "maxReplicas": 3},
                                           runPolicy={"cleanPodPolicy": "All"}))
    kube.create("ddpjobs", status_manifest("ttl", replicas=1, runPolicy={"ttlSecondsAfterFinished": 1}))
    wait(installed, lambda: pod_names(kube) == ["mlp-node-0", "mlp-node-1"], STEP_SECONDS, "two node pods")
    for name in pod_names(kube):
        set_running(kube, name)
    failed_uid = set_terminated(kube, "mlp-node-1", 1)["metadata"]["uid"]
    wait(installed, lambda: status(kube).get("restarts") == 1, STEP_SECONDS, "a counted restart")
    kube.patch("ddpjobs", "mlp", {"spec": {"replicas": 3}})
    wait(installed, lambda: len(pod_names(kube)) == 3
         and (kube.find("pods", "mlp-node-1") or {}).get("metadata", {}).get("uid") not in (None, failed_uid),
         STEP_SECONDS, "node 1 replaced and node 2 added")
    for name in pod_names(kube):
        with contextlib.suppress(ApiError):  # the job may finish and clean up before the last pod reports
            set_terminated(kube, name, 0)
    wait(installed, lambda: pod_names(kube) == [], STEP_SECONDS, "cleanPodPolicy All to delete the pods")
    wait(installed, lambda: pod_names(kube, "ttl") == ["ttl-node-0"], STEP_SECONDS, "the ttl job's pod")
    set_terminated(kube, "ttl-node-0", 0)
    wait(installed, lambda: kube.find("ddpjobs", "ttl") is None, STEP_SECONDS,
         "the finished ttl job deleted after ttlSecondsAfterFinished")


def run_disruption_budget(installed: Installed) -> None:
    """A job's PodDisruptionBudget: created, patched when the job grows, deleted when turned off."""
    kube = installed.kube
    kube.create("ddpjobs", status_manifest("pdb", replicas=1, elasticPolicy={"minReplicas": 1, "maxReplicas": 3}))
    budget = wait(installed, lambda: kube.find("poddisruptionbudgets", "pdb"), STEP_SECONDS, "the job's budget")
    # One node: no eviction would be allowed at 1, so 0; two Ready nodes (the store on node 0): 1.
    assert budget["spec"]["minAvailable"] == 0, budget["spec"]
    kube.patch("ddpjobs", "pdb", {"spec": {"replicas": 2}})
    wait(installed, lambda: pod_names(kube, "pdb") == ["pdb-node-0", "pdb-node-1"], STEP_SECONDS, "two node pods")
    for name in pod_names(kube, "pdb"):  # the budget follows the Ready pods (render/pdb.py)
        set_running(kube, name)
    wait(installed, lambda: kube.get("poddisruptionbudgets", "pdb")["spec"]["minAvailable"] == 1, STEP_SECONDS,
         "the budget patched after the scale")
    kube.patch("ddpjobs", "pdb", {"spec": {"runPolicy": {"podDisruptionBudget": False}}})
    wait(installed, lambda: kube.find("poddisruptionbudgets", "pdb") is None, STEP_SECONDS,
         "the budget deleted when turned off")
    kube.delete("ddpjobs", "pdb")


def run_network_policy_repair(installed: Installed) -> None:
    """A job's NetworkPolicy, opened by an edit, is put back."""
    kube = installed.kube
    kube.create("ddpjobs", status_manifest("np", replicas=1))
    policy = wait(installed, lambda: kube.find("networkpolicies", "np"), STEP_SECONDS, "the job's NetworkPolicy")
    kube.patch("networkpolicies", "np", {"spec": {"ingress": [{}]}})  # admit everyone
    wait(installed, lambda: kube.get("networkpolicies", "np")["spec"] == policy["spec"], STEP_SECONDS,
         "the NetworkPolicy put back")
    kube.delete("ddpjobs", "np")


def run_stuck_pod(installed: Installed, may_read_nodes: bool) -> None:
    """A pod stuck terminating on a NotReady Node (no kubelet confirms its deletion): the operator
    reads the Node and force-deletes it, or, when it may not read Nodes, says so in its log and
    leaves the pod to its node."""
    kube = installed.kube
    node = f"gone-{kube.namespace}"
    kube.create("ddpjobs", status_manifest("stuck", replicas=1, scheduling={"nodeSelector": NOWHERE},
                                           failurePolicy={"forceDeleteTerminatingAfterSeconds": 0}))
    wait(installed, lambda: pod_names(kube, "stuck") == ["stuck-node-0"], STEP_SECONDS, "the stuck job's pod")
    set_node(kube, node, ready=False)
    kube.request("POST", kube.path("pods", "stuck-node-0", subresource="binding"), {
        "apiVersion": "v1", "kind": "Binding", "metadata": {"name": "stuck-node-0"},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node}})
    old = kube.get("pods", "stuck-node-0")["metadata"]["uid"]
    kube.delete("pods", "stuck-node-0", gracePeriodSeconds=1)
    if may_read_nodes:
        wait(installed, lambda: (p := kube.find("pods", "stuck-node-0")) is None or p["metadata"]["uid"] != old,
             STEP_SECONDS, "the stuck pod force-deleted")
    else:
        wait(installed, lambda: f"Cannot read node {node}" in installed.operator_log(200_000), STEP_SECONDS,
             "the operator to log that it may not read the node")
        assert kube.get("pods", "stuck-node-0")["metadata"]["uid"] == old, "force-deleted without reading its node"
    kube.delete("ddpjobs", "stuck")
    with contextlib.suppress(ApiError):
        kube.delete("pods", "stuck-node-0", gracePeriodSeconds=0)  # the kubelet's confirmation


def cleanup_events(kube: KubeClient, reason: str) -> list[str]:
    return [message for _, r, message in events(kube, "etcd") if r == reason]


def run_etcd_job(installed: Installed, endpoint: str, may_read_secrets: bool) -> None:
    """An etcd-v3 job with a credentials Secret: finishes (its keys are deleted, or the cleanup is
    skipped with a Warning when the Secret may not be read), then is deleted (finalizer)."""
    kube = installed.kube
    kube.request("POST", f"/api/v1/namespaces/{kube.namespace}/secrets", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "etcd-client"}, "data": {}})
    kube.create("ddpjobs", status_manifest("etcd", replicas=1, elasticPolicy={
        "rdzvBackend": "etcd-v3", "rdzvEndpoints": [endpoint], "rdzvSecretName": "etcd-client"}))
    wait(installed, lambda: pod_names(kube, "etcd") == ["etcd-node-0"], STEP_SECONDS, "the etcd job's pod")
    set_terminated(kube, "etcd-node-0", 0)
    if may_read_secrets:
        wait(installed, lambda: cleanup_events(kube, etcd_cleanup.REASON_CLEANED), STEP_SECONDS,
             "the etcd job's keys deleted")
    else:
        [warning] = wait(installed, lambda: cleanup_events(kube, etcd_cleanup.REASON_CLEANUP_FAILED), STEP_SECONDS,
                         "a Warning that the cleanup was skipped")
        assert "set the chart value rbac.readSecrets=true to let it" in warning, warning
    kube.delete("ddpjobs", "etcd")
    wait(installed, lambda: kube.find("ddpjobs", "etcd") is None, STEP_SECONDS, "the etcd job deleted")


def run_managed_etcd_job(installed: Installed) -> None:
    """A job with its own etcd: pod and Service created, the pod deleted when the job finishes."""
    kube = installed.kube
    kube.create("ddpjobs", status_manifest("own", replicas=1, elasticPolicy={
        "rdzvBackend": "etcd-v3", "managedEtcd": {"enabled": True}}))
    wait(installed, lambda: kube.find("pods", "own-etcd") and pod_names(kube, "own") == ["own-node-0"],
         STEP_SECONDS, "the managed etcd and the node pod")
    set_terminated(kube, "own-node-0", 0)
    wait(installed, lambda: kube.find("pods", "own-etcd") is None, STEP_SECONDS, "the managed etcd deleted")


# Each mode: chart values and whether it watches only its own namespace (else every namespace).
PEERING = {"peering": {"enabled": True}}  # kopf peering: ClusterKopfPeering, or a KopfPeering per namespace
MODES = {
    "all-namespaces": ({}, False),
    "all-namespaces-read-secrets-peering": ({"rbac": {"readSecrets": True}, **PEERING}, False),
    "watched-namespace": ({}, True),
    "watched-namespace-read-secrets-no-nodes-peering": (
        {"rbac": {"readSecrets": True, "readNodes": False}, **PEERING}, True),
}


def grant_of(request: audit.Request) -> Grant:
    """The RBAC rule entry a request needs: (verb, API group, resource with its subresource)."""
    return (request.verb, request.api_group,
            request.resource + (f"/{request.subresource}" if request.subresource else ""))


def described(request: audit.Request) -> str:
    """A request as a refusal names it: "get core/secrets in NS", "get core/nodes cluster-wide"."""
    verb, group, resource = grant_of(request)
    where = f"in {request.namespace}" if request.namespace else "cluster-wide"
    return f"{verb} {group or 'core'}/{resource} {where}"


@pytest.mark.parametrize("mode", MODES)
def test_the_operator_works_with_exactly_the_chart_rbac_and_uses_every_grant(mode, plane, tmp_path_factory):
    control_plane, kubelets = plane
    values, watched = MODES[mode]
    may_read_secrets = values.get("rbac", {}).get("readSecrets", False)
    may_read_nodes = values.get("rbac", {}).get("readNodes", True)
    start = audit.mark(control_plane.layout.audit_log)
    release = f"rbac-{uuid.uuid4().hex[:4]}"
    with installed_operator(control_plane, kubelets, tmp_path_factory, release=release, values=values,
                            watch=None if watched else []) as installed:
        run_job_lifecycle(installed)
        run_disruption_budget(installed)
        run_network_policy_repair(installed)
        run_stuck_pod(installed, may_read_nodes)
        with running_etcd() as etcd:
            run_etcd_job(installed, etcd.endpoint, may_read_secrets)
        run_managed_etcd_job(installed)
        log = installed.operator_log(200_000)
        namespace, account = installed.kube.namespace, installed.account
        # Its own namespace is the one it watches (or one of all): its ClusterRoles' grants and that Role's.
        grants = granted(installed.kube, account, namespace)
        found = [r for r in audit.requests(control_plane.layout.audit_log, start) if r.user == account and r.resource]
    assert "Traceback" not in log, log[-5000:]
    denied = {described(r) for r in found if r.code == 403}
    withheld = ({f"get core/secrets in {namespace}"} if not may_read_secrets else set()) | (
        {"get core/nodes cluster-wide"} if not may_read_nodes else set())
    assert denied == withheld, "the API server refused the operator more (or less) than the mode withholds"
    assert found, "the audit log recorded no request of the operator's ServiceAccount"
    assert grants, "the API server says the operator's ServiceAccount may do nothing"
    used = {grant_of(r) for r in found if r.code != 403} | NOT_OBSERVABLE
    unused = sorted(grants - used)
    assert unused == [], f"granted but never used by the operator, drop from rbac.yaml: {unused}"
