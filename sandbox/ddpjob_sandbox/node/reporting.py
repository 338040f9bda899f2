"""The API side of the node agent: what a kubelet writes about the pods it runs.

Status writes that never land on a replacement pod of the same name and keep the conditions
others set (DisruptionTarget), the binding to a Node of its own and the Node's Ready condition
(the emulator's opt-in node faults), and the one seam between the two APIs the agent serves
(:class:`NamespacePods`, :class:`NodePods`): which pods are its own and how a deletion ends.

* On the emulator the agent serves one namespace and holds a finalizer while a pod's
  processes run: the emulator knows no node, so nothing else would make it wait for them.
* On a real API server the agent is the kubelet of one Node: it serves the pods bound to that
  Node in every namespace. The API server itself makes a deletion of a bound pod graceful
  (it sets deletionTimestamp and waits); the kubelet, once the containers stopped, deletes
  the pod with grace 0 and a uid precondition, which Node authorization and NodeRestriction
  allow a node for its own pods. No finalizer.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from ddpjob_sandbox.client import ApiError, KubeClient
from ddpjob_sandbox.pod_status import keep_foreign_conditions, node_ready_condition, unschedulable_status

FINALIZER = "sandbox.ddpjob.io/node-agent"  # held while the pod's processes run


class PodReporter:
    """Writes pod and Node objects for the node agent; a pod's namespace where given, else ``client``'s."""

    def __init__(self, client: KubeClient):
        self.client = client

    def hold(self, meta: dict, node: str | None = None) -> bool:
        """Adds the finalizer (and binds the pod to ``node``); False when the pod is gone."""
        held = meta.get("finalizers") or []
        finalizers = held if FINALIZER in held else [*held, FINALIZER]  # a restarted container holds it still
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

    def patch_status(self, name: str, body: dict, uid: str | None = None, namespace: str | None = None) -> None:
        """Writes a pod's status unless the pod is gone or was replaced by another of that name."""
        if uid is not None:
            current = self.client.find("pods", name, namespace)
            if current is None or current["metadata"]["uid"] != uid:
                return
            body = keep_foreign_conditions(body, current)
        with contextlib.suppress(ApiError):
            self.client.patch("pods", name, body, namespace, subresource="status")

    def report_unschedulable(self, pod: dict, message: str) -> None:
        """PodScheduled False with the scheduler's reason and message, written once per pod."""
        scheduled = next((c for c in (pod.get("status") or {}).get("conditions") or []
                          if c.get("type") == "PodScheduled"), {})
        if (scheduled.get("status"), scheduled.get("message")) != ("False", message):
            self.patch_status(pod["metadata"]["name"], unschedulable_status(message), uid=pod["metadata"]["uid"],
                              namespace=pod["metadata"].get("namespace"))

    def services(self, namespace: str | None = None) -> list[dict]:
        """The Services of the namespace (cluster DNS names), [] if unreadable."""
        with contextlib.suppress(ApiError):
            return self.client.list("services", namespace)
        return []

    def service_names(self, namespace: str | None = None) -> list[str]:
        """Service names of the namespace (for ``<pod>.<service>`` DNS names), [] if unreadable."""
        return [s["metadata"]["name"] for s in self.services(namespace)]

    def delete_now(self, pod: dict) -> None:
        """Ends a deletion as a kubelet does once the containers stopped: grace 0, this uid only."""
        meta = pod["metadata"]
        try:
            self.client.delete("pods", meta["name"], meta["namespace"], gracePeriodSeconds=0,
                               preconditions={"uid": meta["uid"]})
        except ApiError as e:
            if e.status not in (404, 409):  # gone already, or a replacement of that name: not ours
                raise

    def claim_dirs(self, pod: dict) -> dict[str, Path]:
        """Claim name -> hostPath of the PersistentVolume it is bound to, for the pod's claims
        that are bound to a hostPath volume (others keep the node's own shared directory)."""
        dirs = {}
        namespace = pod["metadata"]["namespace"]
        for volume in pod["spec"].get("volumes") or []:
            claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
            if not claim:
                continue
            bound = (self.client.get("persistentvolumeclaims", claim, namespace).get("spec") or {}).get("volumeName")
            if bound:
                host_path = (self.client.get("persistentvolumes", bound)["spec"].get("hostPath") or {}).get("path")
                if host_path:
                    dirs[claim] = Path(host_path)
        return dirs


class NamespacePods:
    """The emulator's pods: every pod of the client's namespace, a finalizer held while it runs."""

    def __init__(self, reporter: PodReporter):
        self.reporter = reporter

    def list(self) -> list[dict]:
        return self.reporter.client.list("pods")

    def admit(self, meta: dict, node: str | None) -> bool:
        """Holds the pod for its processes (False: it went away meanwhile)."""
        return self.reporter.hold(meta, node)

    def finish_deletion(self, pod: dict) -> None:
        """The processes stopped: the finalizer goes and the emulator removes the pod."""
        self.reporter.release(pod)

    def forget(self, pod: dict) -> None:
        """A pod deleted before it started: it holds nothing of ours, the emulator removes it."""


class NodePods:
    """A kubelet's pods on a real API server: those bound to ``node`` in every namespace."""

    def __init__(self, reporter: PodReporter, node: str):
        self.reporter = reporter
        self.node = node

    def list(self) -> list[dict]:
        return self.reporter.client.request("GET", "/api/v1/pods",
                                            params={"fieldSelector": f"spec.nodeName={self.node}"})["items"]

    def admit(self, meta: dict, node: str | None) -> bool:
        return True  # the scheduler bound it here; the API server waits for us on deletion

    def finish_deletion(self, pod: dict) -> None:
        self.reporter.delete_now(pod)

    forget = finish_deletion  # never started: nothing to stop, the deletion ends at once
