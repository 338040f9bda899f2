"""One reconciliation pass as a pure function: body + what was observed + now ->
(status, events, actions). The controller (or a test) observes what decide/observation.py
says, calls this and executes the result; every requeue (the progress poll's included) is
one of its actions, and so is deleting a finished job's rendezvous keys.
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
from ddpjob_operator.decide import bounds, isolation, last_valid, phases, rendezvous_keys
from ddpjob_operator.decide.creation import CreateFailure, checked
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
              max_replicas: int | None = None, progress_poll: float = 0.0) -> Reconciliation:
    """Validate, compute the status, then plan from that fresh status.

    Args:
        body: the DDPJob object (metadata, spec, status).
        observed: what the pass observed, read once (decide/observed.py).
        now: the current time.
        operator: the operator's pods, as the job's NetworkPolicy admits them.
        create_failure: the last create the API refused, seen after the previous pass wrote
            its status (None: its creates succeeded); reported as PodCreateFailed.
        max_replicas: the operator's --max-replicas (None: no cap); a job above it is invalid.
        progress_poll: the operator's --progress-poll-seconds (0: never): a training job is
            looked at again this often, to read its progress.
    """
    ref = JobRef.from_body(body)
    errors, parsed = checked(body, max_replicas)  # the pass's one parse of the spec
    spec = last_valid.kept_spec(body, max_replicas) if errors else parsed
    kept = bool(errors) and spec is not None
    update = compute_status(ref, spec, observed, body.get("status"), now, errors=[] if kept else errors,
                            create_failure=create_failure)
    status, invalid_edit = last_valid.record(update.status, body, errors, kept, now)
    status, policy_events = _with_policy_condition(ref, spec, observed, status, body, operator, now)
    update = StatusUpdate(bounds.bounded(status), update.events + invalid_edit + policy_events)
    actions = plan_actions(ref, spec, update.status, observed, now)
    actions = plan_managed_etcd(ref, spec, update.status.get("phase"), observed.managed_etcd) + actions
    if spec is not None and not phases.finished(update.status) and update.status.get("phase") != C.PHASE_SUSPENDED:
        actions = isolation.plan_network_policy(ref, spec, observed.network_policy, operator) + actions
    actions = isolation.behind_network_policy(actions, observed.network_policy)
    actions, forced = with_force_deletions(spec, observed.pods, observed.nodes, now, actions)
    if spec is not None and not phases.finished(update.status):
        pull_wait = image_pull_check_in(observed.pods, now, spec.failure_policy.image_pull_timeout_seconds)
        actions = with_one_requeue(actions, pull_wait)
    # Only a job valid as it stands: an invalid edit says nothing for sure about where its keys are.
    actions += rendezvous_keys.on_finish(ref, spec if not errors else None, update.status, observed.pods)
    actions = with_one_requeue(actions, phases.progress_poll_requeue(update.status, progress_poll))
    return Reconciliation(update.status, update.events + forced, actions, spec, errors)


def _with_policy_condition(ref: JobRef, spec: DDPJobSpec | None, observed: Observed, status: dict[str, Any],
                           body: Mapping[str, Any], operator: OperatorPeer,
                           now: datetime) -> tuple[dict[str, Any], list[Event]]:
    """`status` with the NetworkPolicy condition set (isolation.py), and its Events; a finished
    job's condition is left as it was (its policy is no longer looked at)."""
    if spec is None or phases.finished(status):
        return status, []
    change = isolation.policy_condition(ref, spec, observed.network_policy, operator)
    previous = (body.get("status") or {}).get("conditions")
    conditions, events = isolation.report_policy(list(status.get("conditions") or []), previous, change,
                                                 format_time(now))
    return {**status, "conditions": conditions}, events
