"""Every API request the real operator makes is allowed by the chart's RBAC, and nothing granted goes unused.

The operator runs with the exact arguments the chart's Deployment renders,
against the API emulator (ddpjob_sandbox), through a job's whole life: create,
run, a node failure and its replacement, scale up, success, pod cleanup and
deletion after ttlSecondsAfterFinished, a pod stuck terminating on a NotReady node
(force-deleted after reading its Node), and an etcd-v3 job (a real etcd)
whose rendezvous keys are deleted with the credentials of its Secret, and a
job with a managed etcd. Each request the operator sent (told
apart from the test's own by User-Agent) is turned into an RBAC attribute
(verb, API group, resource, namespace) and checked against the rendered
ClusterRole (all namespaces) or the Role of the watched namespace.
"""
from __future__ import annotations

import contextlib
import re
import sys
import time
from dataclasses import dataclass
from urllib.parse import parse_qs, urlparse

import pytest

from ddpjob_operator.api import constants as C
from tests.charts.support import by_kind, one, render
from ddpjob_sandbox.etcd import running_etcd
from ddpjob_sandbox.scripted import bind, set_node, set_running, set_terminated
from ddpjob_sandbox.jobs import make_manifest
from ddpjob_sandbox.readers import pod_names, status
from ddpjob_sandbox.client import ApiError
from ddpjob_sandbox.operator_process import OperatorProcess
from ddpjob_sandbox.procs import free_port

# Requests from the test itself (urllib client, kubectl) are not the operator's.
TEST_AGENTS = ("Python-urllib", "kubectl")
RESOURCE_PATH = re.compile(
    r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
    r"(?:/namespaces/(?P<namespace>[^/]+))?/(?P<resource>[^/]+)(?:/(?P<name>[^/]+)(?:/(?P<sub>[^/]+))?)?$")


@dataclass(frozen=True)
class Access:
    """One request as RBAC sees it."""

    verb: str
    group: str
    resource: str  # with "/subresource" when there is one
    namespace: str | None  # None: cluster-scoped or across all namespaces

    def __str__(self) -> str:
        where = f"in {self.namespace}" if self.namespace else "cluster-wide"
        return f"{self.verb} {self.group or 'core'}/{self.resource} {where}"


def access_of(method: str, url: str) -> Access | None:
    """RBAC attributes of a request; None for discovery and other non-resource URLs."""
    parsed = urlparse(url)
    match = RESOURCE_PATH.match(parsed.path)
    if match is None:
        return None
    named = match["name"] is not None
    resource = match["resource"] + (f"/{match['sub']}" if match["sub"] else "")
    return Access(_verb(method, named, parsed.query), match["group"] or "", resource, match["namespace"])


def _verb(method: str, named: bool, query: str) -> str:
    if method == "GET":
        return "get" if named else ("watch" if parse_qs(query).get("watch") == ["true"] else "list")
    return {"POST": "create", "PUT": "update", "PATCH": "patch",
            "DELETE": "delete" if named else "deletecollection"}[method]


# Grants no request shows: the API server checks them on other requests.
NOT_OBSERVABLE = {
    # Setting blockOwnerDeletion on a pod's ownerReference (OwnerReferencesPermissionEnforcement).
    ("update", "ddpjob.io", "ddpjobs/finalizers"),
}


def granted(rules: list[dict]) -> set[tuple[str, str, str]]:
    return {(verb, group, resource) for rule in rules for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]}


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


def run_etcd_job(k8s, endpoint: str) -> None:
    """An etcd-v3 job with a credentials Secret: finishes (the keys are deleted), then is deleted (finalizer)."""
    k8s.request("POST", f"/api/v1/namespaces/{k8s.namespace}/secrets", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "etcd-client"}, "data": {}})
    k8s.create("ddpjobs", make_manifest(name="etcd", replicas=1, elasticPolicy={
        "rdzvBackend": "etcd-v3", "rdzvEndpoints": [endpoint], "rdzvSecretName": "etcd-client"}))
    k8s.wait_for(lambda: pod_names(k8s, "etcd") == ["etcd-node-0"], timeout=20, what="the etcd job's pod")
    set_terminated(k8s, "etcd-node-0", 0)
    k8s.wait_for(lambda: any(e["reason"] == "RendezvousKeysDeleted" for e in k8s.list("events")),
                 timeout=20, what="the etcd job's keys deleted")
    k8s.delete("ddpjobs", "etcd")
    k8s.wait_for(lambda: k8s.find("ddpjobs", "etcd") is None, timeout=20, what="the etcd job deleted")


def run_managed_etcd_job(k8s) -> None:
    """A job with its own etcd: pod and Service created, the pod deleted when the job finishes."""
    k8s.create("ddpjobs", make_manifest(name="own", replicas=1, elasticPolicy={
        "rdzvBackend": "etcd-v3", "managedEtcd": {"enabled": True}}))
    k8s.wait_for(lambda: k8s.find("pods", "own-etcd") and pod_names(k8s, "own") == ["own-node-0"],
                 timeout=20, what="the managed etcd and the node pod")
    set_terminated(k8s, "own-node-0", 0)
    k8s.wait_for(lambda: k8s.find("pods", "own-etcd") is None, timeout=20, what="the managed etcd deleted")


def run_stuck_pod(cluster, k8s) -> None:  # noqa: F811
    """A pod stuck terminating on a NotReady node: the operator reads the Node and force-deletes it."""
    cluster.emulator.graceful_pod_deletion = True
    k8s.create("ddpjobs", make_manifest(name="stuck", replicas=1,
                                        failurePolicy={"forceDeleteTerminatingAfterSeconds": 0}))
    k8s.wait_for(lambda: pod_names(k8s, "stuck") == ["stuck-node-0"], timeout=20, what="the stuck job's pod")
    set_node(k8s, "gone-a", ready=False)
    bind(k8s, "stuck-node-0", "gone-a")
    old = k8s.get("pods", "stuck-node-0")["metadata"]["uid"]
    k8s.delete("pods", "stuck-node-0", gracePeriodSeconds=1)
    k8s.wait_for(lambda: (p := k8s.find("pods", "stuck-node-0")) and p["metadata"]["uid"] != old, timeout=20,
                 what="the stuck pod force-deleted and created again")
    cluster.emulator.graceful_pod_deletion = False


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


@pytest.mark.parametrize("mode", ["all-namespaces", "watched-namespace"])
def test_every_operator_request_is_allowed_by_the_chart_rbac(mode, cluster, k8s, tmp_path):  # noqa: F811
    values = {"livenessPort": free_port()}
    if mode == "watched-namespace":
        values["watchNamespaces"] = [k8s.namespace]
    objects = render(values)
    process = OperatorProcess(cluster, [sys.executable, *chart_args(values)], tmp_path / "operator.log")
    with process:
        try:
            run_job_lifecycle(k8s)
            run_stuck_pod(cluster, k8s)
            with running_etcd() as etcd:
                run_etcd_job(k8s, etcd.endpoint)
            run_managed_etcd_job(k8s)
            time.sleep(0.5)  # let the last status write and event land
        finally:
            sys.stdout.write(f"\n--- operator log ---\n{process.log()[-8000:]}\n")
    accesses = operator_accesses(cluster.emulator)
    assert accesses, "recorded no operator requests"

    if mode == "all-namespaces":
        assert by_kind(objects, "Role") == []
        allowed = granted(one(objects, "ClusterRole")["rules"])
        denied = [str(a) for a in accesses if (a.verb, a.group, a.resource) not in allowed]
    else:
        # Only Nodes (cluster-scoped: no Role can grant them) are read outside the namespace.
        cluster_allowed = granted(one(objects, "ClusterRole")["rules"])
        assert cluster_allowed == {("get", "", "nodes")}
        role = one(objects, "Role")
        assert role["metadata"]["namespace"] == k8s.namespace
        allowed = granted(role["rules"]) | cluster_allowed
        denied = [str(a) for a in accesses
                  if (a.verb, a.group, a.resource) not in (cluster_allowed if a.namespace is None else allowed)
                  or a.namespace not in (None, k8s.namespace)]
    assert sorted(denied) == [], f"the operator would be forbidden: {sorted(denied)}"

    used = {(a.verb, a.group, a.resource) for a in accesses} | NOT_OBSERVABLE
    unused = sorted(allowed - used)
    assert unused == [], f"granted but never used by the operator, drop from rbac.yaml: {unused}"
