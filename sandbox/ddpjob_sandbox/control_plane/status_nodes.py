"""Nodes that only report status: thousands of pods on the real control plane, no process each.

A :class:`StatusNode` registers its Node and renews its Lease exactly as a kubelet's
(nodes.Node, logged in as system:node:<name>, so Node authorization and NodeRestriction judge
it the same), watches the pods the scheduler binds to it, and reports each one Running
(pod_status.running_status) without starting anything. A pod given a deletionTimestamp is
deleted for good (grace 0), as a kubelet does once its containers stopped, so the garbage
collector and the operator's deletes finish. A pod's address comes from ``pod_ip``: the pod
network's hashed loopback address by default, or one address where a benchmark serves every
job's progress cheaply (one HTTP server instead of 1,000 trainers).

What a benchmark of 1,000 jobs x 8 pods needs, and what kubelets.py cannot give: a real node
agent starts a process per pod. Costs per Node: one watch and one persistent TLS connection
for its writes (a new handshake per write would cost the API server more than the write),
one Lease renewal and one status post every ``heartbeat_seconds``.
"""
from __future__ import annotations

import contextlib
import http.client
import json
import socket
import ssl
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ddpjob_operator.api import constants as C

from ddpjob_sandbox.client import ApiError
from ddpjob_sandbox.control_plane.components import Layout
from ddpjob_sandbox.control_plane.nodes import Node, deregister, node_client
from ddpjob_sandbox.control_plane.runner import admin_client
from ddpjob_sandbox.node.network import pod_ip as network_pod_ip
from ddpjob_sandbox.pod_status import now_rfc3339, running_status

STATUS_NODE_LABEL = "ddpjob.io/status-only-node"  # on every StatusNode: a nodeSelector for benches and tests
# Enough room for 1,000 jobs x 8 pods on a few Nodes; a kubelet's default is 110 pods.
CAPACITY = {"cpu": "512", "memory": "2Ti", "pods": "1k"}  # as the API server writes 1000 back
WATCH_SECONDS = 240  # the API server ends a watch after this; the node lists again and goes on
HEARTBEAT_SECONDS = 10.0  # a kubelet's default nodeStatusUpdateFrequency


def default_pod_ip(pod: dict) -> str:
    """The address the pod network gives the pod (node.network.pod_ip)."""
    return network_pod_ip(pod["metadata"]["namespace"], pod["metadata"]["name"])


class _Connection:
    """One persistent HTTPS connection to the API server, reopened after an error; one caller at a time."""

    def __init__(self, url: str, context: ssl.SSLContext):
        parsed = urllib.parse.urlsplit(url)
        self.host, self.port, self.context = parsed.hostname, parsed.port, context
        self.connection: http.client.HTTPSConnection | None = None

    def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        data = json.dumps(body).encode() if body is not None else None
        for attempt in (1, 2):  # a kept-alive connection the server closed fails once: reopen it
            if self.connection is None:
                self.connection = http.client.HTTPSConnection(self.host, self.port, context=self.context, timeout=30)
            try:
                self.connection.request(method, path, body=data, headers={"Content-Type": content_type})
                response = self.connection.getresponse()
                text = response.read()
            except (OSError, http.client.HTTPException):
                self.close()
                if attempt == 2:
                    raise
                continue
            if response.status >= 400:
                raise ApiError(response.status, text.decode(errors="replace"), f"{method} {path}")
            return json.loads(text) if text else None
        return None

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()
            self.connection = None


@dataclass
class StatusNode:
    """One Node whose pods are reported Running, and never run."""

    node: Node
    url: str
    context: ssl.SSLContext
    pod_ip: Callable[[dict], str] = default_pod_ip
    reported: dict[str, str] = field(default_factory=dict)  # pod uid -> name, reported Running
    deleted: int = 0  # pods deleted for good after their deletionTimestamp
    errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._writes = _Connection(self.url, self.context)
        self._thread = threading.Thread(target=self._run, name=f"status-node-{self.name}", daemon=True)
        self._watching: http.client.HTTPSConnection | None = None

    @property
    def name(self) -> str:
        return self.node.name

    def start(self) -> "StatusNode":
        self.node.start()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(Exception):
            if self._watching is not None and self._watching.sock is not None:
                self._watching.sock.shutdown(socket.SHUT_RDWR)  # ends the blocking read of the watch
        self._thread.join(timeout=30)
        self._writes.close()
        self.node.stop()

    def _pods_path(self, **params: str) -> str:
        query = urllib.parse.urlencode({"fieldSelector": f"spec.nodeName={self.name}", **params})
        return f"/api/v1/pods?{query}"

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                listed = self._writes.request("GET", self._pods_path())
                for pod in listed["items"]:
                    self.handle(pod)
                self._watch(listed["metadata"]["resourceVersion"])
            except Exception as e:  # noqa: BLE001  a broken watch or a refused write: list again
                if not self._stop.is_set():
                    self.errors.append(repr(e))
                    self._stop.wait(1.0)

    def _watch(self, resource_version: str) -> None:
        parsed = urllib.parse.urlsplit(self.url)
        connection = http.client.HTTPSConnection(parsed.hostname, parsed.port, context=self.context,
                                                 timeout=WATCH_SECONDS + 30)
        self._watching = connection
        try:
            connection.request("GET", self._pods_path(watch="true", resourceVersion=resource_version,
                                                      timeoutSeconds=str(WATCH_SECONDS)))
            response = connection.getresponse()
            if response.status != 200:
                raise ApiError(response.status, response.read().decode(errors="replace"), "watch pods")
            for line in response:
                if self._stop.is_set():
                    return
                event = json.loads(line)
                if event["type"] == "ERROR":  # 410 Gone: the version is compacted, list again
                    return
                if event["type"] in ("ADDED", "MODIFIED"):
                    self.handle(event["object"])
        finally:
            self._watching = None
            connection.close()

    def handle(self, pod: dict) -> None:
        """Reports a new pod Running; deletes for good a pod being deleted."""
        meta, status = pod["metadata"], pod.get("status") or {}
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
        if meta.get("deletionTimestamp"):
            # The kubelet's last word on a deleted pod: its containers are gone, remove the object
            # (only this uid: a replacement of the same name is left alone).
            with contextlib.suppress(ApiError):
                self._writes.request("DELETE", path, {"gracePeriodSeconds": 0,
                                                      "preconditions": {"uid": meta["uid"]}})
                self.deleted += 1
            return
        if meta["uid"] in self.reported or status.get("phase") in ("Running", "Succeeded", "Failed"):
            return
        container = pod["spec"]["containers"][0]["name"] if pod["spec"].get("containers") else C.CONTAINER_NAME
        body = running_status(container, now_rfc3339(), pod_ip=self.pod_ip(pod))
        self._writes.request("PATCH", f"{path}/status", body, "application/merge-patch+json")
        self.reported[meta["uid"]] = meta["name"]


def make_status_node(layout: Layout, name: str, *, pod_ip: Callable[[dict], str] = default_pod_ip,
                     heartbeat_seconds: float = HEARTBEAT_SECONDS, capacity: dict[str, str] | None = None,
                     labels: dict[str, str] | None = None) -> StatusNode:
    client = node_client(layout.pki, layout.apiserver_url, name)
    node = Node(name, client, labels={STATUS_NODE_LABEL: "true", **(labels or {})},
                capacity=dict(capacity or CAPACITY), heartbeat_seconds=heartbeat_seconds)
    return StatusNode(node, layout.apiserver_url, client.ssl_context, pod_ip)


@contextlib.contextmanager
def running_status_nodes(layout: Layout, names: list[str] | tuple[str, ...], **options) -> Iterator[list[StatusNode]]:
    """Status-only Nodes ``names``, registered and reporting their pods until the block ends, then
    deregistered (nodes.deregister; the pod garbage collector removes their pods)."""
    nodes = [make_status_node(layout, name, **options) for name in names]
    started: list[StatusNode] = []
    try:
        for node in nodes:
            started.append(node.start())
        yield nodes
    finally:
        for node in started:
            node.stop()
        deregister(admin_client(layout), [node.name for node in started])


def status_node_names(count: int, prefix: str = "status-node") -> list[str]:
    return [f"{prefix}-{i}" for i in range(count)]


__all__ = ["CAPACITY", "STATUS_NODE_LABEL", "StatusNode", "default_pod_ip", "make_status_node",
           "running_status_nodes", "status_node_names"]
