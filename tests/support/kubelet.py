"""Test helpers that play the parts of a cluster the emulator does not run: the kubelet
(pod status) and the user (DDPJob manifests with fast failure policies)."""
from __future__ import annotations

import datetime
from typing import Any

from ddpjob_operator.api import constants as C
from ddpjob_operator.render.common import selector


def ddpjob(name: str = "mlp", replicas: int = 2, **spec: Any) -> dict:
    """A valid DDPJob manifest; backoffs are short so failure tests stay fast."""
    body_spec = {"replicas": replicas, "image": "ghcr.io/ddpjob/trainer:0.1.0",
                 "module": "ddpjob_trainer.examples.mlp", "args": ["--epochs", "2"],
                 "failurePolicy": {"maxRestarts": 3, "backoffSeconds": 1, "maxBackoffSeconds": 2}}
    body_spec.update(spec)
    return {"apiVersion": C.API_VERSION, "kind": C.KIND, "metadata": {"name": name}, "spec": body_spec}


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_running(k8s, pod: str) -> dict:
    """The kubelet reports the pod's container started and ready."""
    return k8s.patch("pods", pod, {"status": {
        "phase": "Running", "startTime": now(),
        "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now()}],
        "containerStatuses": [{"name": C.CONTAINER_NAME, "ready": True, "restartCount": 0,
                               "state": {"running": {"startedAt": now()}}}]}}, subresource="status")


def set_terminated(k8s, pod: str, exit_code: int, reason: str | None = None) -> dict:
    """The kubelet reports the container exited (restartPolicy Never: the pod phase follows)."""
    phase = "Succeeded" if exit_code == 0 else "Failed"
    reason = reason or ("Completed" if exit_code == 0 else "Error")
    return k8s.patch("pods", pod, {"status": {
        "phase": phase,
        "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": now()}],
        "containerStatuses": [{"name": C.CONTAINER_NAME, "ready": False, "restartCount": 0, "state": {
            "terminated": {"exitCode": exit_code, "reason": reason, "startedAt": now(), "finishedAt": now()}}}]}},
        subresource="status")


def pod_names(k8s, job: str = "mlp") -> list[str]:
    """The job's live node pods (the rendezvous store pod is not a node)."""
    return sorted(p["metadata"]["name"] for p in k8s.list("pods", label_selector=selector(job))
                  if not p["metadata"].get("deletionTimestamp"))


def status(k8s, job: str = "mlp") -> dict:
    return k8s.get("ddpjobs", job).get("status") or {}


def condition(k8s, type_: str, job: str = "mlp") -> dict | None:
    return next((c for c in status(k8s, job).get("conditions") or [] if c["type"] == type_), None)


def events(k8s, job: str = "mlp") -> list[tuple[str, str, str]]:
    return [(e["type"], e["reason"], e["message"]) for e in k8s.list("events")
            if e["involvedObject"]["name"] == job]


def set_unschedulable(k8s, pod: str, message: str = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
                      reason: str = "Unschedulable") -> dict:
    """The scheduler reports it cannot place the pod (PodScheduled False), as kube-scheduler does."""
    return k8s.patch("pods", pod, {"status": {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": reason, "message": message,
         "lastTransitionTime": now()}]}}, subresource="status")


def progress_message(step: int, snapshot_time: str | None = None, epoch: int = 0, error: str | None = None,
                     resume: dict | None = None) -> str:
    """The trainer's progress record (ddpjob_rdzv/progress_record.py) with its last snapshot at `step`."""
    import json
    record = {"kind": C.PROGRESS_RECORD_KIND, "version": 1, "node": "",
              "snapshot": {"epoch": epoch, "step": step, "time": snapshot_time or now(),
                           "path": f"/snapshots/snapshot-s{step:010d}-e{epoch:06d}.pt", "samples_consumed": 0},
              "resume": resume or {"time": now(), "fromStep": None, "fromSnapshotTime": None, "firstStepTime": now()}}
    if error:
        record["error"] = error
    return json.dumps(record)


def set_terminated_with_message(k8s, pod: str, exit_code: int, message: str, reason: str | None = None) -> dict:
    """The container exited and the kubelet copied its termination message file into the status."""
    phase = "Succeeded" if exit_code == 0 else "Failed"
    reason = reason or ("Completed" if exit_code == 0 else "Error")
    return k8s.patch("pods", pod, {"status": {
        "phase": phase,
        "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": now()}],
        "containerStatuses": [{"name": C.CONTAINER_NAME, "ready": False, "restartCount": 0, "state": {
            "terminated": {"exitCode": exit_code, "reason": reason, "message": message, "startedAt": now(),
                           "finishedAt": now()}}}]}}, subresource="status")


def set_disruption_target(k8s, pod: str, reason: str = "PreemptionByScheduler",
                          message: str = "preempted", exit_code: int | None = 143) -> dict:
    """A controller marked the pod DisruptionTarget and it was stopped (exit_code None: still running)."""
    conditions = [{"type": "DisruptionTarget", "status": "True", "reason": reason, "message": message,
                   "lastTransitionTime": now()}]
    if exit_code is None:
        return k8s.patch("pods", pod, {"status": {"conditions": conditions}}, subresource="status")
    return k8s.patch("pods", pod, {"status": {
        "phase": "Failed", "conditions": conditions + [{"type": "Ready", "status": "False", "lastTransitionTime": now()}],
        "containerStatuses": [{"name": C.CONTAINER_NAME, "ready": False, "restartCount": 0, "state": {
            "terminated": {"exitCode": exit_code, "reason": "Error", "startedAt": now(), "finishedAt": now()}}}]}},
        subresource="status")


def set_node(k8s, name: str, ready: bool) -> dict:
    """A Node whose Ready condition is True or False (the node controller's view of its kubelet)."""
    if k8s.find("nodes", name) is None:
        k8s.create("nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    return k8s.patch("nodes", name, {"status": {"conditions": [
        {"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": now()}]}}, subresource="status")


def bind(k8s, pod: str, node: str) -> dict:
    """The scheduler placed the pod on `node` (spec.nodeName)."""
    return k8s.patch("pods", pod, {"spec": {"nodeName": node}})
