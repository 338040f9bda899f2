"""The API side of the node agent: what a kubelet writes about the pods it runs.

A finalizer held while a pod's processes run (so a deletion waits for them, as a kubelet
makes it graceful), the binding to a Node of its own, the Node's Ready condition, and status
writes that never land on a replacement pod of the same name and keep the conditions others
set (DisruptionTarget).
"""
from __future__ import annotations

import contextlib
from typing import Any

from ddpjob_sandbox.client import ApiError, KubeClient
from ddpjob_sandbox.pod_status import keep_foreign_conditions, node_ready_condition, unschedulable_status

FINALIZER = "sandbox.ddpjob.io/node-agent"  # held while the pod's processes run


class PodReporter:
    """Writes pod and Node objects for the node agent, through ``client``'s namespace."""

    def __init__(self, client: KubeClient):
        self.client = client

    def hold(self, meta: dict, node: str | None = None) -> bool:
        """Adds the finalizer (and binds the pod to ``node``); False when the pod is gone."""
        finalizers = [*(meta.get("finalizers") or []), FINALIZER]
        patch: dict[str, Any] = {"metadata": {"finalizers": finalizers, "resourceVersion": meta["resourceVersion"]}}
        if node:
            patch["spec"] = {"nodeName": node}
        try:
            self.client.patch("pods", meta["name"], patch)
        except ApiError as e:
            if e.status in (404, 409):  # deleted or changed meanwhile: look again next tick
                return False
            raise
        return True

    def release(self, pod: dict) -> None:
        """Removes the finalizer: the API server then removes the deleted pod."""
        meta = pod["metadata"]
        rest = [f for f in meta.get("finalizers") or [] if f != FINALIZER]
        with contextlib.suppress(ApiError):
            self.client.patch("pods", meta["name"], {"metadata": {"finalizers": rest or None}})

    def create_node(self, name: str) -> str:
        """A Ready Node object (cluster-scoped) standing for one pod's machine."""
        with contextlib.suppress(ApiError):
            self.client.create("nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
        self.set_node_ready(name, True)
        return name

    def set_node_ready(self, name: str, ready: bool) -> None:
        """The Node's Ready condition, as the node controller sets it."""
        self.client.patch("nodes", name, {"status": {"conditions": [node_ready_condition(ready)]}},
                          subresource="status")

    def patch_status(self, name: str, body: dict, uid: str | None = None) -> None:
        """Writes a pod's status unless the pod is gone or was replaced by another of that name."""
        if uid is not None:
            current = self.client.find("pods", name)
            if current is None or current["metadata"]["uid"] != uid:
                return
            body = keep_foreign_conditions(body, current)
        with contextlib.suppress(ApiError):
            self.client.patch("pods", name, body, subresource="status")

    def report_unschedulable(self, pod: dict, message: str) -> None:
        """PodScheduled False with the scheduler's reason and message, written once per pod."""
        scheduled = next((c for c in (pod.get("status") or {}).get("conditions") or []
                          if c.get("type") == "PodScheduled"), {})
        if (scheduled.get("status"), scheduled.get("message")) != ("False", message):
            self.patch_status(pod["metadata"]["name"], unschedulable_status(message), uid=pod["metadata"]["uid"])

    def service_names(self) -> list[str]:
        """Service names of the namespace (for ``<pod>.<service>`` DNS names), [] if unreadable."""
        with contextlib.suppress(ApiError):
            return [s["metadata"]["name"] for s in self.client.list("services")]
        return []
