"""Small builders of Pod dicts and times for the operator's pure tests.

The DDPJob bodies come from ddpjob_sandbox.jobs (`make_ddpjob(replicas=3)`), the one
builder of tests and benchmarks. `make_pod(job, 1, phase="Failed", exit_code=1)` gives
the job's rendered pod as the API would return it, with an observed status.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.clock import format_time
from ddpjob_operator.render.node_pod import render_pod
from ddpjob_operator.api.job_ref import JobRef
from ddpjob_operator.api.validation import parse_spec
from ddpjob_operator.decide.observed import Observed, ObservedBudget, ObservedEtcd, view_pods

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)  # the fixed clock of the tests


def at(seconds: float) -> datetime:
    """T0 plus `seconds`."""
    return T0 + timedelta(seconds=seconds)


def job_ref(body: dict[str, Any]) -> JobRef:
    """The JobRef of a body."""
    return JobRef.from_body(body)


def make_pod(body: dict[str, Any], index: int, *, phase: str = "Running", ready: bool = True,
             exit_code: int | None = None, reason: str | None = None, finished_at: datetime | None = None,
             deleting: bool = False, disrupted: bool = False, uid: str | None = None,
             created_at: datetime | None = None) -> dict[str, Any]:
    """The rendered pod of node `index` with an observed status.

    phase Running/Pending/Succeeded/Failed; Succeeded implies exit code 0; a Failed pod
    without exit_code gets 1 unless `reason` says it was evicted. created_at sets
    metadata.creationTimestamp (default: T0 - 1 h, i.e. before anything in a test).
    """
    pod = render_pod(job_ref(body), parse_spec(body["spec"]), index)
    pod["metadata"]["uid"] = uid or f"{pod['metadata']['name']}-uid"
    pod["metadata"]["creationTimestamp"] = format_time(created_at or T0 - timedelta(hours=1))
    if deleting:
        pod["metadata"]["deletionTimestamp"] = format_time(T0)
    status: dict[str, Any] = {"phase": phase, "conditions": []}
    if phase == "Running":
        status["conditions"].append({"type": "Ready", "status": "True" if ready else "False"})
        status["containerStatuses"] = [{"name": C.CONTAINER_NAME, "state": {"running": {}}}]
    if phase in ("Succeeded", "Failed"):
        code = 0 if phase == "Succeeded" else exit_code
        if code is None and reason != "Evicted":
            code = 1
        terminated: dict[str, Any] = {"finishedAt": format_time(finished_at or T0)}
        if code is not None:
            terminated["exitCode"] = code
        if reason and reason != "Evicted":
            terminated["reason"] = reason
        status["containerStatuses"] = [{"name": C.CONTAINER_NAME, "state": {"terminated": terminated}}]
    if reason == "Evicted":
        status["reason"] = "Evicted"
    if disrupted:
        status["conditions"].append({"type": "DisruptionTarget", "status": "True"})
    pod["status"] = status
    return pod


def running_pods(body: dict[str, Any], count: int | None = None) -> list[dict[str, Any]]:
    """`count` Running+Ready pods (default: spec.replicas) for indexes 0..count-1."""
    count = body["spec"].get("replicas", 1) if count is None else count
    return [make_pod(body, i) for i in range(count)]


def observe(pods=(), *, service_exists: bool = True, live_progress=(), managed_etcd: ObservedEtcd | None = None,
            nodes=None, disruption_budget: ObservedBudget | None = None,
            store_service_exists: bool | None = None) -> Observed:
    """What a pass observes when the API returns these pod dicts (as controller/observe.py builds it);
    the store pod's Service exists when the job's Service does, unless told otherwise."""
    store_service = service_exists if store_service_exists is None else store_service_exists
    return Observed(view_pods(pods), service_exists, tuple(live_progress), managed_etcd, nodes or {},
                    disruption_budget=disruption_budget, store_service_exists=store_service)
