"""One reconciliation pass as a pure function: body + observed pods + now ->
(status, events, actions). The kopf handlers call this and execute the result."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Iterable, Mapping

from ddpjob_operator.api import constants as C
from ddpjob_operator.decide.failure import image_pull_check_in
from ddpjob_operator.decide.managed_etcd import ObservedEtcd, plan_managed_etcd
from ddpjob_operator.decide.actions import Action, Requeue
from ddpjob_operator.decide.plan import plan_actions
from ddpjob_operator.render.network_policy import OperatorPeer
from ddpjob_operator.api.spec import DDPJobSpec, FieldError, JobRef, validate_job
from ddpjob_operator.decide.actions import Event
from ddpjob_operator.decide.status import compute_status
from ddpjob_operator.decide.stuck import with_force_deletions


@dataclass(frozen=True)
class Reconciliation:
    """Everything one pass decided."""

    status: dict[str, Any]
    events: list[Event]
    actions: list[Action]
    spec: DDPJobSpec | None = None
    errors: list[FieldError] = field(default_factory=list)


def reconcile(body: Mapping[str, Any], pods: Iterable[Mapping[str, Any]], now: datetime, *,
              service_exists: bool, live_progress: Iterable[Mapping[str, Any]] = (),
              managed_etcd: ObservedEtcd | None = None,
              nodes: Mapping[str, Any] | None = None,
              network_policy_exists: bool | None = None,
              operator: OperatorPeer = OperatorPeer()) -> Reconciliation:
    """Validate, compute the status, then plan from that fresh status.

    Args:
        body: the DDPJob object (metadata, spec, status).
        pods: the job's pods, listed fresh for this pass.
        now: the current time.
        service_exists: whether the job's Service exists.
        live_progress: progress records read from running pods this pass.
        managed_etcd: the job's managed etcd as observed (None when the job asks for none).
        nodes: Node objects (None: gone) of the pods past their deletionTimestamp, by name;
            a node left out is unknown and its pods are not force-deleted.
        network_policy_exists: whether the job's NetworkPolicy exists (None: not looked for).
        operator: the operator's pods, as the NetworkPolicy admits them.
    """
    pods = list(pods)
    ref = JobRef.from_body(body)
    errors = validate_job(body)
    spec = None if errors else DDPJobSpec.model_validate(body.get("spec") or {})
    update = compute_status(ref, spec, pods, body.get("status"), now, errors=errors,
                            live_progress=live_progress)
    actions = plan_actions(ref, spec, update.status, pods, now, service_exists=service_exists,
                           network_policy_exists=network_policy_exists, operator=operator)
    actions = plan_managed_etcd(ref, spec, update.status.get("phase"), managed_etcd) + actions
    actions, forced = with_force_deletions(spec, pods, nodes or {}, now, actions)
    if spec is not None and update.status.get("phase") not in C.FINISHED_PHASES:
        actions = _requeue_by(actions, image_pull_check_in(pods, now, spec.failure_policy.image_pull_timeout_seconds))
    return Reconciliation(update.status, update.events + forced, actions, spec, errors)


def _requeue_by(actions: list[Action], after: float | None) -> list[Action]:
    """`actions` with their one Requeue no later than `after` seconds."""
    if after is None:
        return actions
    current = [a.after for a in actions if isinstance(a, Requeue)]
    return [a for a in actions if not isinstance(a, Requeue)] + [Requeue(min(current + [after]))]
