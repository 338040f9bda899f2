"""Builders for the topology and capacity tests: pods of a rendezvous generation, the
store pod, and pods the scheduler could not place (PodScheduled False)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.clock import format_time
from ddpjob_operator.render.store_pod import render_store_pod
from ddpjob_operator.decide.reconcile import Reconciliation, reconcile
from ddpjob_operator.decide.observed import view_pod
from ddpjob_operator.api.validation import parse_spec, validate_spec
from tests.operator.builders import T0, at, job_ref, make_pod, observe

STORE_POD = {"elasticPolicy": {"rdzvStore": "pod"}}  # the c10d default, spelled out
STORE_ON_NODE = {"elasticPolicy": {"rdzvStore": "node"}}  # node 0's agent hosts the store
ETCD_V3 = {"elasticPolicy": {"rdzvBackend": "etcd-v3", "rdzvEndpoints": ["etcd:2379"]}}


def gen_pod(body: dict, index: int, generation: int, **kwargs: Any) -> dict:
    """make_pod, labelled with rendezvous generation `generation` (and a uid naming it)."""
    kwargs.setdefault("uid", f"{body['metadata']['name']}-node-{index}-g{generation}")
    pod = make_pod(body, index, **kwargs)
    pod["metadata"]["labels"][C.LABEL_RDZV_GENERATION] = str(generation)
    return pod


def store(body: dict, phase: str = "Running", *, uid: str = "store-uid", exit_code: int | None = None,
          deleting: bool = False) -> dict:
    """The job's store pod as the API returns it."""
    pod = render_store_pod(job_ref(body), parse_spec(body["spec"]))
    pod["metadata"].update(uid=uid, creationTimestamp=format_time(T0))
    if deleting:
        pod["metadata"]["deletionTimestamp"] = format_time(T0)
    status: dict[str, Any] = {"phase": phase}
    if phase == "Failed":
        status["containerStatuses"] = [{"name": C.RDZV_STORE_CONTAINER, "state": {"terminated": {
            "exitCode": 1 if exit_code is None else exit_code, "finishedAt": format_time(T0)}}}]
    pod["status"] = status
    return pod


def with_store(body: dict, pods: list[dict]) -> list[dict]:
    """`pods` plus the job's running store pod, as the API lists them while node pods train (the
    store pod comes first and goes in the pass where a node succeeds); unchanged for a job
    without one, an invalid spec, or a list that already has it."""
    if (not pods or validate_spec(body["spec"]) or not parse_spec(body["spec"]).elastic_policy.store_on_pod
            or any(view_pod(p).is_store or view_pod(p).phase == "Succeeded" for p in pods)):
        return pods
    return [*pods, store(body)]


def unscheduled(body: dict, index: int, since: datetime, *, generation: int = 0,
                message: str = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
                reason: str = "Unschedulable") -> dict:
    """A Pending node pod the scheduler could not place since `since`."""
    pod = gen_pod(body, index, generation, phase="Pending")
    pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": reason,
                                    "message": message, "lastTransitionTime": format_time(since)}]
    return pod


def scheduled_pending(body: dict, index: int, generation: int = 0) -> dict:
    """A Pending pod already bound to a node (pulling its image)."""
    pod = gen_pod(body, index, generation, phase="Pending")
    pod["spec"]["nodeName"] = "gpu-node-1"
    pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "True"}]
    return pod


def step(job: dict, pods: list, seconds: float, *, service_exists: bool = True) -> Reconciliation:
    """One reconciliation at T0+seconds; the job keeps the new status as the API would."""
    result = reconcile(job, observe(pods, service_exists=service_exists), at(seconds))
    job["status"] = result.status
    return result


def env_of(pod: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
