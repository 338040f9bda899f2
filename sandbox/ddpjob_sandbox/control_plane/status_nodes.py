"""Nodes that run no process, for the real control plane: registered and kept Ready as a kubelet
keeps its Node, but the pods the scheduler binds to them are never started. A test (or a bench of
thousands of pods) says what happened to each pod by writing its status through the pods/status
subresource, as a kubelet would (ddpjob_sandbox.scripted).

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
from ddpjob_sandbox.control_plane.nodes import Node, node_body

STATUS_ONLY_LABEL = "ddpjob.io/status-only-node"
STATUS_ONLY_TAINT = {"key": STATUS_ONLY_LABEL, "value": "true", "effect": "NoSchedule"}
STATUS_ONLY_TOLERATION = {"key": STATUS_ONLY_LABEL, "operator": "Equal", "value": "true", "effect": "NoSchedule"}
# How often a Node looks for its pods marked for deletion (a kubelet's pod sync is event-driven;
# 0.2 s keeps a deletion as prompt as the sandbox kubelets' poll).
DELETION_POLL_SECONDS = 0.2


class StatusOnlyNode(Node):
    """A Node with its heartbeat (nodes.Node) and a loop that removes its pods marked for deletion."""

    def register(self) -> None:
        body = node_body(self.name, {STATUS_ONLY_LABEL: "true", **self.labels}, self.capacity)
        body["spec"] = {"taints": [dict(STATUS_ONLY_TAINT)]}
        try:
            self.client.create("nodes", body)
        except ApiError as e:
            if e.status != 409:  # registered by an earlier run: keep it
                raise
        self.heartbeat()

    def start(self) -> "StatusOnlyNode":
        super().start()
        self._reaper = threading.Thread(target=self._reap_loop, name=f"reaper-{self.name}", daemon=True)
        self._reaper.start()
        return self

    def stop(self) -> None:
        super().stop()
        self._reaper.join(timeout=30)

    def remove_deleted_pods(self) -> list[str]:
        """Removes every pod bound to this Node that is marked for deletion; returns their names."""
        removed = []
        bound = self.client.request("GET", "/api/v1/pods", params={"fieldSelector": f"spec.nodeName={self.name}"})
        for pod in bound["items"]:
            meta = pod["metadata"]
            if not meta.get("deletionTimestamp"):
                continue
            try:
                self.client.delete("pods", meta["name"], namespace=meta["namespace"], gracePeriodSeconds=0,
                                   preconditions={"uid": meta["uid"]})
                removed.append(meta["name"])
            except ApiError as e:
                if e.status not in (404, 409):  # gone already, or a new pod took the name
                    raise
        return removed

    def _reap_loop(self) -> None:
        while not self._stop.wait(DELETION_POLL_SECONDS):
            try:
                self.remove_deleted_pods()
            except Exception as e:  # noqa: BLE001  retried at the next poll, as a kubelet retries
                self.errors.append(repr(e))


@contextlib.contextmanager
def running_status_only_nodes(client: KubeClient, names: list[str] | tuple[str, ...], **options) -> Iterator[list[StatusOnlyNode]]:
    """Status-only Nodes ``names`` registered with ``client`` (the admin's) and kept Ready until the
    block ends (their objects are left to the cluster, as running_nodes leaves them)."""
    nodes = [StatusOnlyNode(name, client, **options) for name in names]
    started: list[StatusOnlyNode] = []
    try:
        for node in nodes:
            started.append(node.start())
        yield nodes
    finally:
        for node in started:
            node.stop()
