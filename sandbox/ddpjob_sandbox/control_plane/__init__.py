"""A real Kubernetes control plane on one machine: etcd, kube-apiserver, kube-controller-manager
and kube-scheduler as local processes, the way controller-runtime's envtest runs them.

The binaries are the pinned releases scripts/cluster/build-binaries.py builds (``make
cluster-binaries``) and links into .cluster/bin/. ``make cluster`` / ``make cluster-down`` run
``python -m ddpjob_sandbox.control_plane up|down`` with the state in .cluster/; the test tier
tests/cluster/ starts one in a temporary folder on free loopback ports.

Modules, each importing only those below it:

    external    a cluster the tests did not start, reached by an admin kubeconfig (``--kubeconfig``):
                what of ControlPlane a kubeconfig gives (url, kubeconfig, client)
    login       how a test client logs in: CA, client certificate, token (fixed, file, exec plugin)
    cluster     what ``make cluster`` runs: the control plane, the kubelets as one background
                process (until 3 Nodes are Ready), hostPath PersistentVolumes; down leaves no process
    kubelets    a Node (nodes) plus the node agent (ddpjob_sandbox.node) running the pods bound
                to it, in-process for the tests or as that background process
    status_nodes  Nodes (nodes) that report their bound pods Running and run nothing: the
                benches' 8,000 pods
    scripted_nodes  Nodes (nodes) that run nothing and write nothing of their pods: a test writes
                each pod's status (ddpjob_sandbox.scripted)
    admission   a validating webhook served from the test's process that refuses pod creates
                with the answer a test picks (429 with Retry-After), registered for the test's pods
    nodes       Nodes that register and keep themselves Ready (Lease, Ready condition), each
                logged in as its own kubelet (system:node:<name>)
    proxy       a TCP proxy in front of the API server adding latency and cutting connections
    audit       requests counted per client from the API server's audit log
    runner      start in order, each healthy before the next (bounded waits, log tail on
                failure); stop by the recorded pids, each process group whole
    components  the command line of each component, and the kubeconfigs (pure)
    pki         the CA, the serving and client certificates, the service-account keys (openssl)
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ddpjob_sandbox.binaries import DEFAULT_BIN_DIR, REPO
from ddpjob_sandbox.client import KubeClient
from ddpjob_sandbox.control_plane.components import NODE_MONITOR_GRACE_SECONDS, Layout
from ddpjob_sandbox.control_plane.login import Login
from ddpjob_sandbox.control_plane.runner import (
    BUILD_COMMAND, ControlPlaneError, admin_client, down, missing_binaries, new_layout, up,
)

__all__ = ["BUILD_COMMAND", "ControlPlane", "ControlPlaneError", "DEFAULT_BIN_DIR", "REPO", "missing_binaries",
           "running_control_plane"]


@dataclass(frozen=True)
class ControlPlane:
    """A started control plane: where it keeps its state and how to log in to it."""

    layout: Layout

    @property
    def kubeconfig(self) -> Path:
        return self.layout.kubeconfig("admin")

    @property
    def url(self) -> str:
        return self.layout.apiserver_url

    def client(self, namespace: str = "default") -> KubeClient:
        """A KubeClient logged in as the admin (system:masters) over the cluster's TLS."""
        return admin_client(self.layout, namespace)

    def login(self) -> Login:
        """The admin's login as files (what kopf's ConnectionInfo takes): the CA, its client certificate."""
        pki = self.layout.pki
        return Login(self.url, ca_file=pki / "ca.crt", certificate_file=pki / "admin.crt", key_file=pki / "admin.key")


@contextlib.contextmanager
def running_control_plane(root: Path, bin_dir: Path = DEFAULT_BIN_DIR, *,
                          node_monitor_grace_seconds: int = NODE_MONITOR_GRACE_SECONDS,
                          apiserver_flags: tuple[str, ...] = ()) -> Iterator[ControlPlane]:
    """Yields a started control plane with its state in ``root``; stops every process on exit.
    ``node_monitor_grace_seconds``: how long a Node may stay silent before it counts as lost;
    ``apiserver_flags``: added to kube-apiserver's."""
    layout = new_layout(root, bin_dir, node_monitor_grace_seconds, apiserver_flags)
    up(layout)
    try:
        yield ControlPlane(layout)
    finally:
        down(layout.root)
