"""Nodes whose pods' status a test writes, for the real control plane: registered (by the admin)
and kept Ready as a kubelet keeps its Node, but the pods the scheduler binds to them are never
started. A test says what happened to each pod by writing its status through the pods/status
subresource, as a kubelet would (ddpjob_sandbox.scripted). Unlike status_nodes.py's, whose Nodes
log in as kubelets and report every bound pod Running themselves (for benches of thousands of
pods), these never write a pod's status: the test's story of the pod is the only one.

They carry :data:`STATUS_ONLY_TAINT`, so only a pod that tolerates it lands on them: a pod meant
to run (an example job's, a rendezvous store pod without that toleration) never waits on a Node
that will not start it.

What a kubelet does that these still must: once a pod's containers stopped, the kubelet removes
its object (a delete with grace 0); nothing runs here, so a pod bound to one of these Nodes is
removed as soon as it is marked for deletion. Without that, every deleted pod would stay
Terminating forever and neither the operator's replacements nor the garbage collector's
deletions would ever finish.
"""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from ddpjob_sandbox.client import ApiError, KubeClient
from ddpjob_sandbox.control_plane.nodes import Node, deregister, node_body

STATUS_ONLY_LABEL = "ddpjob.io/status-only-node"
STATUS_ONLY_TAINT = {"key": STATUS_ONLY_LABEL, "value": "true", "effect": "NoSchedule"}
STATUS_ONLY_TOLERATION = {"key": STATUS_ONLY_LABEL, "operator": "Equal", "value": "true", "effect": "NoSchedule"}
# How often a Node looks for its pods marked for deletion (a kubelet's pod sync is event-driven;
# 0.2 s keeps a deletion as prompt as the sandbox kubelets' poll).
DELETION_POLL_SECONDS = 0.2


class StatusOnlyNode(Node):
    """A Node with its heartbeat (nodes.Node) and the taint that keeps pods meant to run off it."""

    def register(self) -> None:
        body = node_body(self.name, {STATUS_ONLY_LABEL: "true", **self.labels}, self.capacity)
        body["spec"] = {"taints": [dict(STATUS_ONLY_TAINT)]}
        try:
            self.client.create("nodes", body)
        except ApiError as e:
            if e.status != 409:  # registered by an earlier run: keep it
                raise
        self.heartbeat()


class Reaper:
    """Removes the pods bound to the status-only Nodes once they are marked for deletion: one
    list of all pods per poll for all the Nodes (a field selector matches one node only)."""

    def __init__(self, client: KubeClient, nodes: list[str] | tuple[str, ...], poll_seconds: float = DELETION_POLL_SECONDS):
        self.client, self.nodes, self.poll_seconds = client, set(nodes), poll_seconds
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="status-only-reaper", daemon=True)

    def remove_deleted_pods(self) -> list[str]:
        """Removes every pod of these Nodes that is marked for deletion; returns their names."""
        removed = []
        for pod in self.client.request("GET", "/api/v1/pods")["items"]:
            meta = pod["metadata"]
            if not meta.get("deletionTimestamp") or pod["spec"].get("nodeName") not in self.nodes:
                continue
            try:
                self.client.delete("pods", meta["name"], namespace=meta["namespace"], gracePeriodSeconds=0,
                                   preconditions={"uid": meta["uid"]})
                removed.append(meta["name"])
            except ApiError as e:
                if e.status not in (404, 409):  # gone already, or a new pod took the name
                    raise
        return removed

    def start(self) -> "Reaper":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            try:
                self.remove_deleted_pods()
            except Exception as e:  # noqa: BLE001  retried at the next poll, as a kubelet retries
                self.errors.append(repr(e))


@contextlib.contextmanager
def running_status_only_nodes(client: KubeClient, names: list[str] | tuple[str, ...], **options) -> Iterator[list[StatusOnlyNode]]:
    """Status-only Nodes ``names`` registered with ``client`` (the admin's), kept Ready and their
    deleted pods removed until the block ends, then deregistered (nodes.deregister)."""
    nodes = [StatusOnlyNode(name, client, **options) for name in names]
    started: list[StatusOnlyNode] = []
    reaper = Reaper(client, names)
    try:
        for node in nodes:
            started.append(node.start())
        reaper.start()
        yield nodes
    finally:
        reaper.stop()
        for node in started:
            node.stop()
        deregister(client, [node.name for node in started])
