"""What a kubelet, kube-scheduler or node controller reports, as plain dicts.

The node agent (ddpjob_sandbox.node) writes these for the pods it runs; a test or benchmark
without one writes the same bodies through ddpjob_sandbox.scripted, and a pure caller (the
goodput benchmark feeding the operator's progress reader) wraps one in :func:`observed_pod`.
Each ``*_status`` returns ``{"status": {...}}``, a body for the pod's status subresource.
"""
from __future__ import annotations

import datetime
import json
from collections.abc import Mapping
from typing import Any

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.clock import format_time

LOOPBACK = "127.0.0.1"  # every sandbox pod runs on this machine
INSUFFICIENT_GPU = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."  # kube-scheduler's words


def now_rfc3339() -> str:
    """Now, as the kubelet writes times: RFC 3339, UTC, whole seconds."""
    return format_time(datetime.datetime.now(datetime.timezone.utc))


def running_status(container: str, started_at: str, pod_ip: str = LOOPBACK, host_ip: str = LOOPBACK,
                   restart_count: int = 0, last_terminated: Mapping[str, Any] | None = None) -> dict:
    """What a kubelet reports once the container started (ready: no probes are rendered); after a
    restart, how many and how the previous one ended (``last_terminated``: a ``terminated`` state)."""
    conditions = [{"type": t, "status": "True", "lastTransitionTime": started_at}
                  for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")]
    status = {"name": container, "ready": True, "started": True, "restartCount": restart_count,
              "image": "sandbox", "imageID": "", "state": {"running": {"startedAt": started_at}}}
    if last_terminated:
        status["lastState"] = {"terminated": dict(last_terminated)}
    return {"status": {
        "phase": "Running", "hostIP": host_ip, "podIP": pod_ip, "podIPs": [{"ip": pod_ip}],
        "startTime": started_at, "conditions": conditions, "containerStatuses": [status]}}


def back_off_status(container: str, pod: str, restart_count: int, last_terminated: Mapping[str, Any],
                    back_off_seconds: float) -> dict:
    """What a kubelet reports while it waits to restart a container that exited (restartPolicy
    Always, or OnFailure after a failure): still Running, not ready, CrashLoopBackOff."""
    now = now_rfc3339()
    conditions = [{"type": t, "status": "False", "lastTransitionTime": now, "reason": "ContainersNotReady"}
                  for t in ("ContainersReady", "Ready")]
    message = f"back-off {back_off_seconds:g}s restarting failed container={container} pod={pod}"
    return {"status": {"phase": "Running", "conditions": conditions, "containerStatuses": [{
        "name": container, "ready": False, "started": False, "restartCount": restart_count, "image": "sandbox",
        "imageID": "", "state": {"waiting": {"reason": "CrashLoopBackOff", "message": message}},
        "lastState": {"terminated": dict(last_terminated)}}]}}


def terminated_state(started_at: str, finished_at: str, exit_code: int, message: str | None = None,
                     reason: str | None = None) -> dict:
    """A container's ``terminated`` state: ``reason`` defaults to the runtime's Completed (exit 0)
    or Error; OOMKilled is one other."""
    return {"exitCode": exit_code, "reason": reason or ("Completed" if exit_code == 0 else "Error"),
            "startedAt": started_at, "finishedAt": finished_at, **({"message": message} if message else {})}


def terminated_status(container: str, started_at: str, finished_at: str, exit_code: int,
                      message: str | None = None, reason: str | None = None, restart_count: int = 0) -> dict:
    """What a kubelet reports when the container exited for good (restartPolicy Never, or
    OnFailure after a success): the phase follows (see terminated_state for ``reason``)."""
    terminated = terminated_state(started_at, finished_at, exit_code, message, reason)
    conditions = [{"type": t, "status": "False", "lastTransitionTime": finished_at, "reason": "PodCompleted"}
                  for t in ("ContainersReady", "Ready")]
    return {"status": {
        "phase": "Succeeded" if exit_code == 0 else "Failed", "conditions": conditions,
        "containerStatuses": [{"name": container, "ready": False, "started": False, "restartCount": restart_count,
                               "image": "sandbox", "imageID": "", "state": {"terminated": terminated}}]}}


def waiting_status(container: str, message: str) -> dict:
    """A container that cannot be created (stays Pending), as a kubelet reports a config error."""
    return {"status": {"phase": "Pending", "containerStatuses": [{
        "name": container, "ready": False, "started": False, "restartCount": 0, "image": "sandbox",
        "imageID": "", "state": {"waiting": {"reason": "CreateContainerConfigError", "message": message}}}]}}


def unschedulable_status(message: str = INSUFFICIENT_GPU, reason: str = "Unschedulable") -> dict:
    """What kube-scheduler reports for a pod it cannot place: Pending, PodScheduled False."""
    return {"status": {"phase": "Pending", "conditions": [{
        "type": "PodScheduled", "status": "False", "reason": reason, "message": message,
        "lastTransitionTime": now_rfc3339()}]}}


def disruption_condition(reason: str, message: str) -> dict:
    """DisruptionTarget, as the scheduler (preemption), the taint manager or the eviction API set it."""
    return {"type": "DisruptionTarget", "status": "True", "reason": reason, "message": message,
            "lastTransitionTime": now_rfc3339()}


def node_ready_condition(ready: bool) -> dict:
    """A Node's Ready condition as the node controller sets it."""
    return {"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": now_rfc3339(),
            "reason": "KubeletReady" if ready else "NodeStatusUnknown",
            "message": "kubelet is posting ready status" if ready else "Kubelet stopped posting node status."}


def keep_foreign_conditions(body: dict, pod: Mapping[str, Any]) -> dict:
    """``body`` with the pod's conditions of types it does not set kept, as a kubelet keeps
    those others own (DisruptionTarget from the scheduler or the eviction API); a merge
    patch would otherwise replace the whole list."""
    new = (body.get("status") or {}).get("conditions")
    if new is None:
        return body
    types = {c["type"] for c in new}
    kept = [c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") not in types]
    return {**body, "status": {**body["status"], "conditions": [*new, *kept]}}


def observed_pod(name: str, body: Mapping[str, Any], uid: str | None = None) -> dict:
    """A pod as a list returns it, with only a name, a uid and the status ``body`` (for pure readers)."""
    return {"metadata": {"name": name, "uid": uid or name}, **body}


def progress_message(step: int | None, snapshot_time: str | None = None, epoch: int = 0, error: str | None = None,
                     resume: dict | None = None, node: str = "") -> str:
    """The trainer's progress record (ddpjob_rdzv/contract/progress_record.py) with its last snapshot at
    ``step`` (None: no snapshot yet), as its container leaves it in ``terminated.message``."""
    snapshot = None if step is None else {
        "epoch": epoch, "step": step, "time": snapshot_time or now_rfc3339(),
        "path": f"/snapshots/snapshot-s{step:010d}-e{epoch:06d}.pt", "samples_consumed": 0}
    record = {"kind": C.PROGRESS_RECORD_KIND, "version": 1, "node": node, "snapshot": snapshot,
              "resume": resume or {"time": now_rfc3339(), "fromStep": None, "fromSnapshotTime": None,
                                   "firstStepTime": now_rfc3339()}}
    if error:
        record["error"] = error
    return json.dumps(record)
