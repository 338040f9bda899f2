"""Nodes for the real control plane: each registers itself and keeps itself Ready, as a kubelet does.

A Node logs in with its own client certificate (system:node:<name>), so the API server's Node
authorizer and NodeRestriction admission judge it as they judge a kubelet. It creates its Node
with capacity and labels, then every ``heartbeat_seconds`` renews its Lease in kube-node-lease
and posts its Ready condition; the controller manager's node-lifecycle controller would mark it
NotReady and taint it after 40 s without either. Running the pods bound to it: kubelets.py.
"""
from __future__ import annotations

import contextlib
import datetime
import ssl
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ddpjob_sandbox.client import ApiError, KubeClient
from ddpjob_sandbox.control_plane.components import Layout, kubeconfig_text
from ddpjob_sandbox.control_plane.pki import Identity, make_client_cert, node_identity
from ddpjob_sandbox.control_plane.runner import admin_client
from ddpjob_sandbox.pod_status import now_rfc3339

LEASE_NAMESPACE = "kube-node-lease"
LEASE_SECONDS = 40  # a kubelet's default lease duration
DEFAULT_CAPACITY = {"cpu": "4", "memory": "8Gi", "pods": "110"}


def _micro_time() -> str:
    """A Lease's renewTime: RFC 3339 with microseconds (the API's MicroTime)."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def node_body(name: str, labels: dict[str, str], capacity: dict[str, str]) -> dict:
    """The Node a kubelet registers: the well-known labels, its capacity, no condition yet."""
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                                  "kubernetes.io/arch": "amd64", **labels}},
            "status": {"capacity": dict(capacity), "allocatable": dict(capacity)}}


def ready_status(capacity: dict[str, str]) -> dict:
    now = now_rfc3339()
    return {"status": {"capacity": dict(capacity), "allocatable": dict(capacity), "conditions": [
        {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status",
         "lastHeartbeatTime": now, "lastTransitionTime": now}]}}


@dataclass
class Node:
    """One registered Node and its heartbeat thread."""

    name: str
    client: KubeClient
    labels: dict[str, str] = field(default_factory=dict)
    capacity: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_CAPACITY))
    heartbeat_seconds: float = 10.0
    errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"node-{self.name}", daemon=True)

    def register(self) -> None:
        try:
            self.client.create("nodes", node_body(self.name, self.labels, self.capacity))
        except ApiError as e:
            if e.status != 409:  # registered by an earlier run: keep it
                raise
        self.heartbeat()

    def heartbeat(self) -> None:
        """Renews the Lease (creating it the first time) and posts Ready."""
        lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                 "metadata": {"name": self.name, "namespace": LEASE_NAMESPACE},
                 "spec": {"holderIdentity": self.name, "leaseDurationSeconds": LEASE_SECONDS,
                          "renewTime": _micro_time()}}
        try:
            self.client.patch("leases", self.name, {"spec": lease["spec"]}, namespace=LEASE_NAMESPACE)
        except ApiError as e:
            if e.status != 404:
                raise
            self.client.create("leases", lease, namespace=LEASE_NAMESPACE)
        self.client.patch("nodes", self.name, ready_status(self.capacity), subresource="status",
                          patch_type="strategic")

    def start(self) -> "Node":
        self.register()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        while not self._stop.wait(self.heartbeat_seconds):
            try:
                self.heartbeat()
            except Exception as e:  # noqa: BLE001  a missed beat is retried; the controller tolerates 40 s
                self.errors.append(repr(e))


def identity_client(pki: Path, api_url: str, identity: Identity) -> KubeClient:
    """A client logged in with ``identity``'s client certificate (made if missing); its kubectl
    uses ``pki/<stem>.kubeconfig``."""
    crt, key = make_client_cert(pki, identity)
    kubeconfig = pki / f"{identity.stem}.kubeconfig"
    kubeconfig.write_text(kubeconfig_text(pki, api_url, identity.stem))
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    context.load_cert_chain(str(crt), str(key))
    return KubeClient(api_url, kubeconfig, ssl_context=context)


def node_client(pki: Path, api_url: str, name: str) -> KubeClient:
    """A client that logs in as the kubelet of Node ``name``."""
    return identity_client(pki, api_url, node_identity(name))


def deregister(admin: KubeClient, names: Iterable[str]) -> None:
    """Deletes the Node objects ``names`` and force-deletes the pods still bound to them, as an
    admin removes nodes that leave for good and the pod garbage collector then removes their pods
    (after 40 s, which the next test's cleanup would wait for). With the admin's client: a kubelet
    may not delete its own Node. Left registered, a stopped Node stays Ready for the lifecycle
    controller's grace period, and the scheduler binds the next pods to it, where nothing will
    ever run them."""
    for name in names:
        try:
            admin.delete("nodes", name)
        except ApiError as e:
            if e.status != 404:
                raise
        for pod in admin.request("GET", "/api/v1/pods", params={"fieldSelector": f"spec.nodeName={name}"})["items"]:
            meta = pod["metadata"]
            with contextlib.suppress(ApiError):  # 404: gone meanwhile
                admin.delete("pods", meta["name"], meta["namespace"], gracePeriodSeconds=0)


@contextlib.contextmanager
def running_nodes(layout: Layout, names: list[str], **options) -> Iterator[list[Node]]:
    """Registered Nodes kept Ready until the block ends, then deregistered."""
    nodes = [Node(name, node_client(layout.pki, layout.apiserver_url, name), **options) for name in names]
    started: list[Node] = []
    try:
        for node in nodes:
            started.append(node.start())
        yield nodes
    finally:
        for node in started:
            node.stop()
        deregister(admin_client(layout), [node.name for node in started])
