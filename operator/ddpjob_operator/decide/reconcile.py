"""One reconciliation pass as a pure function: body + what was observed + now ->
(status, events, actions). The controller (or a test) observes, calls this and executes the result.
An invalid edit of a job that was valid runs the pass with its last valid spec (last_valid.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Mapping

from ddpjob_operator.api import constants as C
from ddpjob_operator.render.network_policy import OperatorPeer
from ddpjob_operator.api.clock import format_time
from ddpjob_operator.api.job_ref import JobRef
from ddpjob_operator.api.spec import DDPJobSpec
from ddpjob_operator.api.validation import FieldError
from ddpjob_operator.decide.actions import Action, Event, with_one_requeue
from ddpjob_operator.decide import bounds, isolation, last_valid
from ddpjob_operator.decide.creation import CreateFailure, job_errors
from ddpjob_operator.decide.failure import image_pull_check_in
from ddpjob_operator.decide.managed_etcd import plan_managed_etcd
from ddpjob_operator.decide.observed import Observed
from ddpjob_operator.decide.plan import plan_actions
from ddpjob_operator.decide.status import StatusUpdate, compute_status
from ddpjob_operator.decide.stuck import with_force_deletions


@dataclass(frozen=True)
class Reconciliation:
    """Everything one pass decided."""

    status: dict[str, Any]
    events: list[Event]
    actions: list[Action]
    spec: DDPJobSpec | None = None
    errors: list[FieldError] = field(default_factory=list)


def reconcile(body: Mapping[str, Any], observed: Observed, now: datetime, *,
              operator: OperatorPeer = OperatorPeer(), create_failure: CreateFailure | None = None,
              max_replicas: int | None = None) -> Reconciliation:
    """Validate, compute the status, then plan from that fresh status.

    Args:
        body: the DDPJob object (metadata, spec, status).
        observed: what the pass observed, read once (decide/observed.py).
        now: the current time.
        operator: the operator's pods, as the job's NetworkPolicy admits them.
        create_failure: the last create the API refused, seen after the previous pass wrote
            its status (None: its creates succeeded); reported as PodCreateFailed.
        max_replicas: the operator's --max-replicas (None: no cap); a job above it is invalid.
    """
    ref = JobRef.from_body(body)
    errors = job_errors(body, max_replicas)
    spec = last_valid.kept_spec(body, max_replicas) if errors else DDPJobSpec.model_validate(body.get("spec") or {})
    kept = bool(errors) and spec is not None
    update = compute_status(ref, spec, observed, body.get("status"), now, errors=[] if kept else errors,
                            create_failure=create_failure)
    status, invalid_edit = last_valid.record(update.status, body, errors, kept, now)
    policy_events = _report_policy(ref, spec, observed, status, body, operator, now)  # sets its condition
    update = StatusUpdate(bounds.bounded(status), update.events + invalid_edit + policy_events)
    actions = plan_actions(ref, spec, update.status, observed, now)
    actions = plan_managed_etcd(ref, spec, update.status.get("phase"), observed.managed_etcd) + actions
    if spec is not None and update.status.get("phase") not in C.FINISHED_PHASES + (C.PHASE_SUSPENDED,):
        actions = isolation.plan_network_policy(ref, spec, observed.network_policy, operator) + actions
    actions = isolation.behind_network_policy(actions, observed.network_policy)
    actions, forced = with_force_deletions(spec, observed.pods, observed.nodes, now, actions)
    if spec is not None and update.status.get("phase") not in C.FINISHED_PHASES:
        pull_wait = image_pull_check_in(observed.pods, now, spec.failure_policy.image_pull_timeout_seconds)
        actions = with_one_requeue(actions, pull_wait)
    return Reconciliation(update.status, update.events + forced, actions, spec, errors)


def _report_policy(ref: JobRef, spec: DDPJobSpec | None, observed: Observed, status: dict[str, Any],
                   body: Mapping[str, Any], operator: OperatorPeer, now: datetime) -> list[Event]:
    """Sets the NetworkPolicy condition in `status` (isolation.py); returns its Events."""
    if spec is None or status.get("phase") in C.FINISHED_PHASES:
        return []
    change = isolation.policy_condition(ref, spec, observed.network_policy, operator)
    previous = (body.get("status") or {}).get("conditions")
    status["conditions"], events = isolation.report_policy(list(status.get("conditions") or []), previous, change,
                                                           format_time(now))
    return events
