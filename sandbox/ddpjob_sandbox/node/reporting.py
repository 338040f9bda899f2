"""The API side of the node agent: what a kubelet reads and writes about the pods it runs.

Its pods are those bound to its Node, in every namespace. Status writes never land on a
replacement pod of the same name and keep the conditions others set (DisruptionTarget). The API
server itself makes a deletion of a bound pod graceful (it sets deletionTimestamp and waits);
the kubelet, once the containers stopped, deletes the pod with grace 0 and a uid precondition,
which Node authorization and NodeRestriction allow a node for its own pods.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from ddpjob_sandbox.client import ApiError, KubeClient
from ddpjob_sandbox.pod_status import keep_foreign_conditions


class PodReporter:
    """Reads and writes pods for the node agent; a pod's namespace where given, else ``client``'s."""

    def __init__(self, client: KubeClient):
        self.client = client

    def node_pods(self, node: str) -> list[dict]:
        """The pods bound to ``node``, in every namespace (a kubelet may list no others)."""
        return self.client.request("GET", "/api/v1/pods", params={"fieldSelector": f"spec.nodeName={node}"})["items"]

    def patch_status(self, name: str, body: dict, uid: str | None = None, namespace: str | None = None) -> None:
        """Writes a pod's status unless the pod is gone or was replaced by another of that name."""
        if uid is not None:
            current = self.client.find("pods", name, namespace)
            if current is None or current["metadata"]["uid"] != uid:
                return
            body = keep_foreign_conditions(body, current)
        with contextlib.suppress(ApiError):
            self.client.patch("pods", name, body, namespace, subresource="status")

    def services(self, namespace: str | None = None) -> list[dict]:
        """The Services of the namespace (cluster DNS names), [] if unreadable."""
        with contextlib.suppress(ApiError):
            return self.client.list("services", namespace)
        return []

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

