"""The kubelets of the real control plane: each registered Node (nodes.Node) with a node agent
(ddpjob_sandbox.node) that runs the pods the scheduler binds to it as local processes.

Both log in as the Node's own kubelet (system:node:<name>), so Node authorization and
NodeRestriction judge every write as they judge a kubelet's: its own Node and Lease, the status
and deletion of its own pods, tokens bound to its own pods, the ConfigMaps/Secrets/claims they name.

In-process (:func:`running_kubelets`, what the test tier uses: a test reads the agents) or as
one background process (``python -m ddpjob_sandbox.control_plane.kubelets``, what ``make
cluster`` starts beside the control plane). Every process a kubelet starts carries
``SANDBOX_NODE=<cluster marker>/<node>``, and the background process itself
``<cluster marker>/kubelets``, so ``make cluster-down`` finds whatever outlived a SIGTERM
by the marker's prefix (:func:`cluster_marker`).
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import logging
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ddpjob_sandbox.client import KubeClient
from ddpjob_sandbox.control_plane.nodes import Node, deregister, identity_client, node_client
from ddpjob_sandbox.control_plane.pki import CLUSTER_DNS
from ddpjob_sandbox.node import NodeAgent
from ddpjob_sandbox.node.container import ContainerReader, PodProcess

DEFAULT_NODES = ("node-0", "node-1", "node-2")
NODE_LABEL = "ddpjob.io/sandbox-node"  # on every Node a sandbox kubelet runs: a nodeSelector for tests
POLL_SECONDS = 0.5  # each kubelet lists its pods this often (3 kubelets: 6 requests/s at rest)
HEARTBEAT_SECONDS = 10.0  # a kubelet's default nodeStatusUpdateFrequency


def cluster_marker(root: Path) -> str:
    """The prefix of the SANDBOX_NODE marker of one cluster's kubelets and pods (by its state folder)."""
    return "cluster-" + hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:12]


@dataclass
class Kubelet:
    """One Node: its registration and heartbeat, and the agent running its pods."""

    node: Node
    agent: NodeAgent

    @property
    def name(self) -> str:
        return self.node.name

    def start(self) -> "Kubelet":
        self.node.start()
        self.agent.start()
        return self

    def stop(self) -> None:
        """Stops the heartbeat and every process of the Node's pods (the Node object stays)."""
        try:
            self.agent.stop()
        finally:
            self.node.stop()


class Containers(ContainerReader):
    """One namespace's containers across the kubelets, read and faulted as a test reads one node
    agent's (NodeAgent.current, wait_for_container, kill, pod_listening_on, logs).

    On a real cluster the scheduler picks the Node, and a pod's replacement may run on another
    Node than the pod it replaces: each look-up asks every kubelet, and the current container of
    a pod is the one of the uid the API server holds (else, the pod gone, the last started).
    A claim is the hostPath of the PersistentVolume it is bound to (the PV binder binds it).
    ``prefix``: only pods whose name starts with it (a test's jobs in a namespace tests share).
    """

    def __init__(self, kubelets: Sequence[Kubelet], client: KubeClient, prefix: str = "", bind_seconds: float = 60):
        self.kubelets = list(kubelets)
        self.client = client
        self.prefix = prefix
        self.bind_seconds = bind_seconds

    def _of(self, name: str) -> list[PodProcess]:
        return [c for c in self.all() if c.name == name]

    def all(self) -> list[PodProcess]:
        """Every container started for these pods, finished ones included."""
        # list() copies each agent's dict at once (under the GIL) while its loop may add to it.
        return [c for k in self.kubelets for c in list(k.agent.pods.values())
                if c.namespace == self.client.namespace and c.name.startswith(self.prefix)]

    def current(self, name: str) -> PodProcess | None:
        """The container of pod ``name`` as it is now in the API, else the last one started."""
        found = self._of(name)
        if not found:
            return None
        pod = self.client.find("pods", name)
        uid = pod["metadata"]["uid"] if pod else None
        return next((c for c in found if c.uid == uid), None) or max(found, key=lambda c: c.started_at)

    def diagnosis(self) -> str:
        return f"kubelet errors: {self.errors()}"

    def pod_listening_on(self, port: int) -> str | None:
        """The pod whose process listens on TCP ``port`` (the c10d store host), if any."""
        return next((name for k in self.kubelets if (name := k.agent.pod_listening_on(port))), None)

    def claim_dir(self, claim: str) -> Path:
        """The directory of claim ``claim`` of this namespace, once it is bound."""
        volume = self.client.wait_for(
            lambda: ((self.client.find("persistentvolumeclaims", claim) or {}).get("spec") or {}).get("volumeName"),
            timeout=self.bind_seconds, interval=0.2, what=f"claim {claim} bound to a volume")
        host_path = (self.client.get("persistentvolumes", volume)["spec"].get("hostPath") or {}).get("path")
        if not host_path:
            raise AssertionError(f"claim {claim} is bound to {volume}, which is no hostPath volume")
        return Path(host_path)

    def errors(self) -> dict[str, list[str]]:
        return {k.name: k.agent.errors[-3:] for k in self.kubelets}

    def logs(self, chars: int = 2500) -> str:
        """The namespace's containers' logs, each under its pod, uid and Node."""
        return "\n".join(f"--- pod {c.name} uid {c.uid[:8]} (exit {c.exit_code}) ---\n{c.log(chars)}"
                         for c in self.all()) + f"\nkubelet errors: {self.errors()}"


def make_kubelet(pki: Path, api_url: str, name: str, root: Path, *, heartbeat_seconds: float = HEARTBEAT_SECONDS,
                 poll_seconds: float = POLL_SECONDS, labels: dict[str, str] | None = None,
                 pod_api_url: str | None = None, **agent_options) -> Kubelet:
    """A Node ``name`` and its agent, both logged in to ``api_url`` as the Node's kubelet; its
    pods reach the API server at ``pod_api_url`` (default ``api_url``; a test's fault proxy)."""
    client = node_client(pki, api_url, name)
    marker = f"{cluster_marker(root)}/{name}"
    agent = NodeAgent(client, root / "nodes" / name, poll_seconds=poll_seconds, node_name=name,
                      api_url=pod_api_url or api_url,
                      node_id=marker, dns_client=identity_client(pki, api_url, CLUSTER_DNS), **agent_options)
    node = Node(name, client, labels={NODE_LABEL: "true", **(labels or {})}, heartbeat_seconds=heartbeat_seconds)
    return Kubelet(node, agent)


@contextlib.contextmanager
def joining_kubelet(admin: KubeClient, pki: Path, api_url: str, name: str, root: Path, *,
                    capacity: dict[str, str] | None = None, **options) -> Iterator[Kubelet]:
    """A Node that joins the cluster for the block (``capacity`` on top of the default, as a
    machine with a GPU), then leaves it: its kubelet stopped (every pod process of it killed), then
    deregistered by ``admin`` (nodes.deregister).
    A test's own Node: to lose it, fill it, or add capacity."""
    kubelet = make_kubelet(pki, api_url, name, root, **options)
    kubelet.node.capacity.update(capacity or {})
    kubelet.start()
    try:
        yield kubelet
    finally:
        try:
            kubelet.stop()
        finally:
            deregister(admin, [name])


@contextlib.contextmanager
def running_kubelets(pki: Path, api_url: str, root: Path, names: tuple[str, ...] | list[str] = DEFAULT_NODES,
                     **options) -> Iterator[list[Kubelet]]:
    """Kubelets of the Nodes ``names``, registered and running pods until the block ends (then
    every pod process is gone; the Node objects are left to the cluster)."""
    kubelets = [make_kubelet(pki, api_url, name, root, **options) for name in names]
    started: list[Kubelet] = []
    try:
        for kubelet in kubelets:
            started.append(kubelet.start())
        yield kubelets
    finally:
        errors = []
        for kubelet in started:
            try:
                kubelet.stop()
            except Exception as e:  # noqa: BLE001  stop the others too, then say what survived
                errors.append(f"{kubelet.name}: {e}")
        if errors:
            raise RuntimeError("; ".join(errors))


def main(argv: list[str] | None = None) -> int:
    """The background process of ``make cluster``: runs until SIGTERM, then stops every pod."""
    parser = argparse.ArgumentParser(prog="python -m ddpjob_sandbox.control_plane.kubelets")
    parser.add_argument("--dir", type=Path, required=True, help="the cluster's state folder")
    parser.add_argument("--api-url", required=True)
    parser.add_argument("--nodes", default=",".join(DEFAULT_NODES))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    root = args.dir.resolve()
    with running_kubelets(root / "pki", args.api_url, root, args.nodes.split(",")) as kubelets:
        logging.info("kubelets of %s running", ", ".join(k.name for k in kubelets))
        while not stop.wait(5):
            for kubelet in kubelets:
                for error in kubelet.agent.errors[-3:] + kubelet.node.errors[-3:]:
                    logging.warning("%s: %s", kubelet.name, error)
                kubelet.agent.errors.clear()
                kubelet.node.errors.clear()
    return 0


if __name__ == "__main__":
    sys.exit(main())
