"""The kubelet's status writes (and a scheduler's or node controller's) played by a script, one at a time.

For pods nothing runs (the operator's e2e tests, the operator benchmark): the real scheduler
binds them to Nodes that start nothing (control_plane.scripted_nodes), so a test says what
happened to each (started, exited, unschedulable, disrupted, its Node down) and the real
operator reacts. The bodies are ddpjob_sandbox.pod_status's, the ones the node agent writes for
real processes.
"""
from __future__ import annotations

from ddpjob_operator.api import constants as C

from ddpjob_sandbox.client import KubeClient
from ddpjob_sandbox.pod_status import (
    INSUFFICIENT_GPU,
    disruption_condition,
    node_ready_condition,
    now_rfc3339,
    running_status,
    terminated_status,
    unschedulable_status,
)


def set_running(k8s: KubeClient, pod: str) -> dict:
    """The kubelet reports the pod's container started and ready."""
    return k8s.patch("pods", pod, running_status(C.CONTAINER_NAME, now_rfc3339()), subresource="status")


def set_terminated(k8s: KubeClient, pod: str, exit_code: int, reason: str | None = None,
                   message: str | None = None) -> dict:
    """The kubelet reports the container exited, with ``message`` copied from its termination
    message file (restartPolicy Never: the pod phase follows)."""
    now = now_rfc3339()
    body = terminated_status(C.CONTAINER_NAME, now, now, exit_code, message, reason=reason)
    return k8s.patch("pods", pod, body, subresource="status")


def set_unschedulable(k8s: KubeClient, pod: str, message: str = INSUFFICIENT_GPU,
                      reason: str = "Unschedulable") -> dict:
    """The scheduler reports it cannot place the pod (PodScheduled False), as kube-scheduler does."""
    return k8s.patch("pods", pod, unschedulable_status(message, reason), subresource="status")


def set_disruption_target(k8s: KubeClient, pod: str, reason: str = "PreemptionByScheduler",
                          message: str = "preempted", exit_code: int | None = 143) -> dict:
    """A controller marked the pod DisruptionTarget and it was stopped (exit_code None: still running)."""
    condition = disruption_condition(reason, message)
    if exit_code is None:
        return k8s.patch("pods", pod, {"status": {"conditions": [condition]}}, subresource="status")
    now = now_rfc3339()
    body = terminated_status(C.CONTAINER_NAME, now, now, exit_code, reason="Error")
    body["status"]["conditions"].insert(0, condition)
    return k8s.patch("pods", pod, body, subresource="status")


def set_node(k8s: KubeClient, name: str, ready: bool) -> dict:
    """A Node whose Ready condition is True or False (the node controller's view of its kubelet)."""
    if k8s.find("nodes", name) is None:
        k8s.create("nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    return k8s.patch("nodes", name, {"status": {"conditions": [node_ready_condition(ready)]}}, subresource="status")
