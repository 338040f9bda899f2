"""The imitated pod network (pure): each pod's loopback address and the cluster DNS names a
kubelet on the real control plane resolves for its pods (tests/cluster/test_kubelet.py runs them)."""
from __future__ import annotations

from pathlib import Path

import pytest

from ddpjob_sandbox.node.launch import Placement, UnsupportedPodError, container_launch, map_hosts
from ddpjob_sandbox.node.network import LOOPBACK, Resolver, network_env, pod_ip
from ddpjob_sandbox.node.projection import Projector


def a_pod(name: str, *, labels: dict | None = None, hostname: str = "", subdomain: str = "",
          phase: str = "Running", deleting: bool = False) -> dict:
    meta = {"name": name, "namespace": "ns", "uid": f"uid-{name}", "labels": labels or {}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    spec = {"containers": [{"name": "main", "command": ["python"]}]}
    spec.update({k: v for k, v in (("hostname", hostname), ("subdomain", subdomain)) if v})
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


SERVICES = [{"metadata": {"name": "mlp"}, "spec": {"clusterIP": "None", "selector": {"job": "mlp"}}},
            {"metadata": {"name": "store"}, "spec": {"selector": {"role": "store"}}},
            {"metadata": {"name": "external"}, "spec": {}}]


def test_a_pods_address_is_stable_per_name_distinct_between_names_and_never_the_machines():
    addresses = {pod_ip("ns", f"mlp-node-{i}") for i in range(200)}
    assert len(addresses) == 200
    assert pod_ip("ns", "mlp-node-0") == pod_ip("ns", "mlp-node-0") != pod_ip("other", "mlp-node-0")
    for address in addresses:
        octets = [int(o) for o in address.split(".")]
        assert octets[0] == 127 and 1 <= octets[1] <= 254 and 1 <= octets[3] <= 254, address


def test_pod_names_resolve_to_the_pod_with_that_hostname_and_subdomain_or_the_pod_of_that_name():
    resolver = Resolver("ns", SERVICES, [a_pod("p-0", hostname="web-0", subdomain="mlp"),
                                         a_pod("mlp-node-1", hostname="mlp-node-1", subdomain="mlp")])
    assert resolver("web-0.mlp.ns.svc.cluster.local") == pod_ip("ns", "p-0"), "by spec.hostname, not the name"
    assert resolver("mlp-node-1.mlp.ns.svc") == resolver("mlp-node-1.mlp") == pod_ip("ns", "mlp-node-1")
    assert resolver("mlp-node-7.mlp.ns.svc") == pod_ip("ns", "mlp-node-7"), "a pod not created yet: its name"


def test_a_service_name_resolves_to_the_first_live_pod_it_selects_else_the_loopback():
    pods = [a_pod("a-done", labels={"role": "store"}, phase="Succeeded"),
            a_pod("b-going", labels={"role": "store"}, deleting=True),
            a_pod("c-live", labels={"role": "store"}), a_pod("d-live", labels={"role": "store"})]
    resolver = Resolver("ns", SERVICES, pods)
    assert resolver("store.ns.svc.cluster.local") == pod_ip("ns", "c-live")
    assert resolver("external.ns.svc") == LOOPBACK, "no selector: nothing the cluster would route"
    assert resolver("store.elsewhere.svc") == LOOPBACK, "another namespace's Services are not looked up"


def test_names_in_env_values_and_args_are_rewritten_with_the_resolver(tmp_path: Path):
    resolver = Resolver("ns", SERVICES, [a_pod("mlp-node-0", hostname="mlp-node-0", subdomain="mlp")])
    assert map_hosts("mlp-node-0.mlp.ns.svc.cluster.local:29400,example.com:1", "ns", ["mlp"], resolver) == \
        f"{pod_ip('ns', 'mlp-node-0')}:29400,example.com:1"
    pod = a_pod("mlp-node-1")
    pod["spec"]["containers"][0].update(
        env=[{"name": "EP", "value": "mlp-node-0.mlp:29400"},
             {"name": "ME", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
             {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
        args=["--peer", "mlp-node-0.mlp.ns.svc:1"])
    pod["spec"]["nodeName"] = "node-2"
    address = pod_ip("ns", "mlp-node-1")
    placement = Placement(pod_ip=address, resolve=resolver, env=network_env(address))
    launch = container_launch(pod, tmp_path, resolver.service_names, {"PET_LOCAL_ADDR": "machine"}, placement=placement)
    peer = pod_ip("ns", "mlp-node-0")
    assert (launch.env["EP"], launch.argv[-1]) == (f"{peer}:29400", f"{peer}:1")
    assert (launch.env["ME"], launch.env["NODE"]) == (address, "node-2")
    assert (launch.env["DDPJOB_LISTEN_HOST"], launch.env["PET_LOCAL_ADDR"]) == (address, address)


class FakeApi:
    """The two requests a Projector makes, answered from a dict (no API server)."""

    def __init__(self, objects: dict[str, dict]):
        self.objects = objects
        self.requests: list[tuple[str, str, dict | None]] = []

    def request(self, method: str, path: str, body: dict | None = None, **_):
        self.requests.append((method, path, body))
        if method == "POST":
            return {"status": {"token": "t0ken"}}
        return self.objects[path]


def test_projected_volumes_get_a_pod_bound_token_the_ca_and_the_namespace(tmp_path: Path):
    api = FakeApi({"/api/v1/namespaces/ns/configmaps/kube-root-ca.crt": {"data": {"ca.crt": "CA"}}})
    pod = a_pod("op")
    pod["spec"]["serviceAccountName"] = "operator"
    pod["spec"]["volumes"] = [{"name": "kube-api-access", "projected": {"sources": [
        {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}}]}}]
    Projector(api).fill(pod, {"kube-api-access": tmp_path}, Placement())
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == {"token": "t0ken", "ca.crt": "CA", "namespace": "ns"}
    (method, path, body), *_ = api.requests
    assert (method, path) == ("POST", "/api/v1/namespaces/ns/serviceaccounts/operator/token")
    assert body["spec"]["boundObjectRef"] == {"apiVersion": "v1", "kind": "Pod", "name": "op", "uid": "uid-op"}


def test_a_projected_path_may_not_leave_its_volume(tmp_path: Path):
    api = FakeApi({"/api/v1/namespaces/ns/configmaps/c": {"data": {"k": "v"}}})
    pod = a_pod("op")
    pod["spec"]["volumes"] = [{"name": "v", "configMap": {"name": "c", "items": [{"key": "k", "path": "../escape"}]}}]
    with pytest.raises(UnsupportedPodError, match="projected path '../escape' leaves its volume"):
        Projector(api).fill(pod, {"v": tmp_path / "v"}, Placement())
