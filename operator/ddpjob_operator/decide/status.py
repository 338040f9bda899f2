"""Compute a DDPJob's status from its spec, its observed pods, the previous status and now.

Pure: `compute_status` returns the whole new status (written once per pass) and
the Events to emit, which are only produced when something changed (a phase
flip, a newly seen failure, a new validation message). Conditions follow the
Kubernetes convention: lastTransitionTime moves only when a condition's status flips.

Each verdict's own Event (why the phase is what it is) is posted once, by `_phase`, when the
verdict is news; the rules that reach a verdict add only the Events of what they saw on the way.

The status is built, never edited: the previous status is only read. Each rule is a small
function that returns its part (a `_Part`: the fields it sets and the Events that explain
them, or a `_Verdict` on the phase); `compute_status` folds the parts into a new dict in the
order the rules depend on one another (failures are noted before the budget is judged, a
group restart moves the generation before the current group is read), and orders it once.

Failure bookkeeping lives in the status so that a pass is idempotent:
`handledFailures` holds the uids of failed pods already counted (pruned to pods
still observed), `restarts` counts failure incidents (see budget.starts_new_incident:
nodes that were running when an incident began and fail within a minute join it;
a replacement that fails again always opens a new one),
`lastFailureTime` is when the current incident began; plan.py waits
`backoff_seconds(restarts)` after it before creating replacements.
`rendezvousGeneration` counts whole-group restarts (topology.py: the c10d store was lost);
node pods of older generations are left out of every count and decision here.
The node counts and `unschedulable`, and the NodesUnschedulable condition, come from capacity.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Iterable, Mapping

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.clock import format_time, parse_time, seconds_between
from ddpjob_operator.api.job_ref import JobRef
from ddpjob_operator.api.spec import DDPJobSpec
from ddpjob_operator.api.status import STATUS_FIELDS
from ddpjob_operator.api.validation import FieldError
from ddpjob_operator.decide import avoided_nodes, capacity, creation, progress, topology
from ddpjob_operator.decide.actions import Event
from ddpjob_operator.decide.bounds import cut
from ddpjob_operator.decide.conditions import condition_of, set_condition  # set_condition: callers import it here too
from ddpjob_operator.decide.budget import (
    failure_message, judge, ledger_fields, ledger_of, limit_verdict, open_incident, replacement_delay
)
from ddpjob_operator.decide.failure import (
    INVALID_IMAGE_REASONS, Outcome, after_finish, classify_pod, describe_exit, diagnose_deleted_by_someone, diagnose_image_pull,
    diagnose_pod, opens_incident, permanent_failure
)
from ddpjob_operator.decide import hang as hang_policy, straggler as straggler_policy
from ddpjob_operator.decide.observed import ACTIVE_PHASES, NodeGroups, Observed, PodView, live_fatal
from ddpjob_operator.render.common import selector

Status = Mapping[str, Any]  # a status being built: read, never written (each step makes a new one)


@dataclass(frozen=True)
class StatusUpdate:
    """The new status and the Events that explain what changed."""

    status: dict[str, Any]
    events: list[Event] = field(default_factory=list)


@dataclass(frozen=True)
class _Part:
    """What one rule decided: the status fields it sets, and the Events that explain them."""

    changes: Mapping[str, Any] = field(default_factory=dict)
    events: tuple[Event, ...] = ()


@dataclass(frozen=True)
class _Verdict:
    """Phase with its reason and message, plus the Events found on the way."""

    phase: str
    reason: str
    message: str
    events: tuple[Event, ...] = ()


def _with(status: Status, *parts: _Part) -> dict[str, Any]:
    """A new status: `status` with the parts' fields set over it, in order."""
    return {**status, **{key: value for part in parts for key, value in part.changes.items()}}


def compute_status(ref: JobRef, spec: DDPJobSpec | None, observed: Observed,
                   previous: Mapping[str, Any] | None, now: datetime, *,
                   errors: Iterable[FieldError] = (),
                   create_failure: creation.CreateFailure | None = None) -> StatusUpdate:
    """The status after one observation.

    Args:
        ref: the job's identity (generation becomes observedGeneration).
        spec: the parsed spec, or None when it is invalid (then `errors` says why).
        observed: what the pass observed: the job's pods, and the progress records read
            from running pods (taken like those in termination messages).
        previous: the status stored on the object (None or {} for a new job); only read.
        now: the current time (tests pass a fixed clock).
        errors: validation errors of the spec; non-empty means InvalidSpec.
        create_failure: the last create the API refused (None: the last creates succeeded),
            reported as the PodCreateFailed condition (creation.py).
    """
    prev, errors = previous or {}, list(errors)
    invalid = bool(errors) or spec is None
    carried = _carried(prev)
    # Before failures: the failed pods' records tell whether training progressed.
    ingested = progress.ingest(observed.pods, carried, observed.live_progress, parse_time(ref.created), now)
    status = {**carried, **ingested.changes, **_counts(ref, spec, observed.node_pods),
              "observedGeneration": ref.generation}
    verdict, groups, status = _judged(ref, spec, observed, prev, status, now, errors)
    if not invalid:
        found = _capacity(spec, groups, prev, status)
        status, verdict = _with(status, found), replace(verdict, events=verdict.events + found.events)
    phase = _phase(prev, verdict, now, invalid)
    status = _with(status, phase)
    events = phase.events + tuple(ingested.events)
    if not invalid and status["phase"] not in C.FINISHED_PHASES + (C.PHASE_SUSPENDED,):
        unschedulable = _unschedulable_condition(prev, status["conditions"], spec, groups, now)
        status, events = _with(status, unschedulable), events + unschedulable.events
    if status["phase"] not in C.FINISHED_PHASES:
        created = _create_failed_condition(prev, status["conditions"], create_failure, now)
        status, events = _with(status, created), events + created.events
    return StatusUpdate(_ordered(status), list(events))


def _judged(ref: JobRef, spec: DDPJobSpec | None, observed: Observed, prev: Status, status: Status,
            now: datetime, errors: list[FieldError]) -> tuple[_Verdict, NodeGroups | None, dict[str, Any]]:
    """The verdict on the phase, the group it was judged on (None for an invalid spec), and the
    status with what judging it noted (failures, the ledger, a group restart, progress)."""
    if errors or spec is None:
        return _invalid(errors), None, dict(status)
    groups = observed.of_generation(topology.generation_of(status), spec.node_pods)
    if _finished_before(prev):
        return _Verdict(prev["phase"], "", ""), groups, dict(status)  # finished jobs never change phase
    if spec.run_policy.suspend:
        status = {**status, "startTime": None}  # like a Job: the deadline clock restarts on resume
        verdict, status = _suspended(spec, groups, status, now)
        return verdict, groups, status
    status = {**status, "startTime": status.get("startTime") or format_time(now)}
    return _active_pass(ref, spec, observed, status, now, prev.get("phase"))


def _active_pass(ref: JobRef, spec: DDPJobSpec, observed: Observed, status: Status, now: datetime,
                 prev_phase: str | None) -> tuple[_Verdict, NodeGroups, dict[str, Any]]:
    """The verdict on a job that runs (neither invalid, finished nor suspended), its current
    group, and the status with what it noted: failures, a group restart when the store was
    lost or the job hung, stragglers."""
    noted = _note_failures(spec, observed.pods, status, now)  # every pod, the old generation's too
    status = _with(status, noted)
    restart = topology.begin_group_restart(ref.name, spec, observed, status, now)
    status = {**status, **(restart.changes if restart else {})}
    groups = observed.of_generation(topology.generation_of(status), spec.node_pods)
    deleted = _note_deleted(spec, groups, status, now)
    status = _with(status, deleted)
    watched = _watch_progress(spec, observed, groups, status, now, prev_phase, restart is None)
    status = _with(status, watched.part)
    if watched.hang:
        groups = observed.of_generation(topology.generation_of(status), spec.node_pods)
    verdict, status = _active_verdict(spec, groups, status, now, prev_phase)
    verdict = replace(verdict, events=noted.events + deleted.events + verdict.events)
    if restart:
        verdict = _group_restart_verdict(verdict, restart.message, prev_phase, C.REASON_GROUP_RESTART)
    elif watched.hang:
        verdict = _group_restart_verdict(verdict, watched.hang.message, prev_phase, C.REASON_HANG)
    verdict = replace(verdict, events=verdict.events + watched.part.events)
    return _live_fatal(observed, verdict), groups, status


def _carried(prev: Status) -> dict[str, Any]:
    """The fields a pass starts from: the previous pass's bookkeeping (counters, failures,
    progress); everything else is computed afresh."""
    keys = ("restarts", "lastFailureTime", "handledFailures", "lastSnapshot", "startTime",
            "completionTime", "rendezvousGeneration", "restartsWithProgress", "restartsWithoutProgress",
            "failures", "recovery", "invalidProgressRecords", "progress", "avoidedNodes", "finishing",
            "workerRestarts", "workerRestartsByPod")
    return {**{k: prev.get(k) for k in keys}, "restarts": int(prev.get("restarts") or 0),
            "handledFailures": list(prev.get("handledFailures") or [])}


def _counts(ref: JobRef, spec: DDPJobSpec | None, pods: Iterable[PodView]) -> dict[str, Any]:
    pods = tuple(pods)
    ready = sum(1 for p in pods if p.running_ready)
    desired = spec.node_pods if spec else 0
    return {
        "replicas": sum(1 for p in pods if p.active),
        "readyReplicas": ready,
        "ready": f"{ready}/{desired}",
        "replicaRange": f"{spec.min_replicas}:{spec.max_replicas}" if spec else None,
        "selector": selector(ref.name),
    }


def _capacity(spec: DDPJobSpec, groups: NodeGroups, prev: Status, status: Status) -> _Part:
    """The node counts and `unschedulable` (capacity.py), avoidedNodes (avoided_nodes.py), and
    the Events of a scale and of a node newly avoided."""
    current = groups.current
    counts = {**capacity.node_counts(spec, current), "unschedulable": capacity.unschedulable(current) or None}
    avoided, events = avoided_nodes.updated(prev.get("failures"), status.get("failures"), prev.get("avoidedNodes"))
    return _Part({**counts, "avoidedNodes": avoided}, tuple(_scaled(prev, {**status, **counts})) + tuple(events))


def _group_restart_verdict(verdict: _Verdict, message: str, prev_phase: str | None, reason: str) -> _Verdict:
    """Restarting, explained by the group restart (the store was lost, or a hang); its Event is
    the phase-change Event that _phase posts, plus one here only when the phase was Restarting
    already (no change)."""
    event = Event(C.EVENT_WARNING, reason, message)
    if verdict.phase == C.PHASE_FAILED:  # the incident spent the budget
        return replace(verdict, events=verdict.events + (event,))
    return _Verdict(C.PHASE_RESTARTING, reason, message,
                    verdict.events + ((event,) if prev_phase == C.PHASE_RESTARTING else ()))


@dataclass(frozen=True)
class _Watched:
    """What the nodes' heartbeats decided this pass: a hang's group restart, and the fields
    (progress, the ledger, failures) and straggler Events."""

    hang: hang_policy.HangRestart | None = None
    part: _Part = _Part()


def _watch_progress(spec: DDPJobSpec, observed: Observed, groups: NodeGroups, status: Status,
                    now: datetime, prev_phase: str | None, may_restart: bool) -> _Watched:
    """status.progress from the heartbeats read this pass; a hang restarts the group (hang.py),
    a straggler is reported or replaced (straggler.py)."""
    live = observed.liveness
    tracked = hang_policy.tracked(spec.failure_policy, status.get("progress"), live, now)
    current = [p for p in groups.current if p.active]
    all_running = prev_phase == C.PHASE_RUNNING and len(groups.running) >= spec.min_replicas and \
        all(p.phase == "Running" for p in current)
    found = hang_policy.detect(tracked, live, all_running, now) if may_restart else None
    if found is not None:
        status = {**status, "progress": tracked}
        restart = hang_policy.begin_hang_restart(spec, status, found, groups.current, now)
        status = {**status, **restart.changes}
        return _Watched(restart, _Part({"progress": tracked, **restart.changes,
                                        "failures": _listed(status.get("failures"), restart.failure)}))
    judged = straggler_policy.judge(spec.straggler_policy, tracked, live, groups.current, now)
    merged = {**tracked, **judged.progress}
    replaced = {} if judged.replace is None else {"failures": _listed(status.get("failures"), judged.replace)}
    return _Watched(None, _Part({"progress": {k: v for k, v in merged.items() if v is not None} or None, **replaced},
                                tuple(judged.events)))


def _listed(failures: Iterable[Mapping[str, Any]] | None, entry: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """status.failures with `entry` last, keeping the newest C.MAX_FAILURES_KEPT."""
    return (list(failures or []) + [entry])[-C.MAX_FAILURES_KEPT:]


def _live_fatal(observed: Observed, verdict: _Verdict) -> _Verdict:
    """Failed at once when a running node's live record says a worker raised DoNotRetry: its
    pod need not exit first (torchrun would restart the workers before it does)."""
    found = live_fatal(observed.live_progress)
    if found is None or verdict.phase == C.PHASE_FAILED:
        return verdict
    node, fatal = found
    message = C.MSG_DO_NOT_RETRY.format(what=f"node {node}: {fatal.get('message')}", reason=fatal["reason"])
    return _with_events(verdict, _Verdict(C.PHASE_FAILED, fatal["reason"], message))


def _unschedulable_condition(prev: Status, conditions: list[dict[str, Any]], spec: DDPJobSpec,
                             groups: NodeGroups, now: datetime) -> _Part:
    """The NodesUnschedulable condition, and an Event when it flips."""
    current = groups.current
    late, now_s = capacity.overdue(spec, current, now), format_time(now)
    old = condition_of(prev.get("conditions"), C.COND_NODES_UNSCHEDULABLE) or {}
    if late:
        message = C.MSG_UNSCHEDULABLE.format(count=len(late), timeout=spec.scheduling.pending_timeout_seconds,
                                             effect=capacity.capacity_effect(spec, len(groups.running)),
                                             pods="; ".join(late))
        flipped = old.get("status") != "True"
        return _Part({"conditions": set_condition(conditions, C.COND_NODES_UNSCHEDULABLE, "True",
                                                  C.REASON_UNSCHEDULABLE, message, now_s)},
                     (Event(C.EVENT_WARNING, C.REASON_UNSCHEDULABLE, message),) if flipped else ())
    if old.get("status") == "True":
        return _Part({"conditions": set_condition(conditions, C.COND_NODES_UNSCHEDULABLE, "False",
                                                  C.REASON_SCHEDULED, C.MSG_SCHEDULED, now_s)},
                     (Event(C.EVENT_NORMAL, C.REASON_SCHEDULED, C.MSG_SCHEDULED),))
    return _Part()


def _create_failed_condition(prev: Status, conditions: list[dict[str, Any]],
                             failure: creation.CreateFailure | None, now: datetime) -> _Part:
    """The PodCreateFailed condition and its Events, as creation.py decides them."""
    change = creation.create_failed_condition(failure, condition_of(prev.get("conditions"), C.COND_POD_CREATE_FAILED))
    if change is None:
        return _Part()
    return _Part({"conditions": set_condition(conditions, C.COND_POD_CREATE_FAILED, change.status, change.reason,
                                              change.message, format_time(now))}, tuple(change.events))


def _invalid(errors: list[FieldError]) -> _Verdict:
    # Cut as the condition keeps it: the next pass compares the two to tell a new message (an Event).
    message = cut("; ".join(e.message for e in errors) or "spec could not be parsed", C.MAX_CONDITION_MESSAGE_CHARS)
    return _Verdict(C.PHASE_FAILED, C.REASON_INVALID_SPEC, message)


def _active_verdict(spec: DDPJobSpec, groups: NodeGroups, status: Status,
                    now: datetime, prev_phase: str | None) -> tuple[_Verdict, dict[str, Any]]:
    """Phase of a job that is neither invalid, finished nor suspended, and the status with the
    failures counted (and the wait for the last nodes after training finished)."""
    failure, status = _record_failures(spec, groups, status, now)
    if failure.phase == C.PHASE_FAILED:
        return failure, status
    deadline = spec.run_policy.active_deadline_seconds
    started = parse_time(status["startTime"])
    if deadline and started and seconds_between(started, now) >= deadline:
        return _with_events(failure, _Verdict(C.PHASE_FAILED, C.REASON_DEADLINE,
                                              C.MSG_DEADLINE.format(deadline=deadline))), status
    current, succeeded = groups.current, groups.succeeded
    # Pending pods do not hold completion up: they can never join the closed rendezvous.
    if succeeded and not any(p.active and p.phase != "Pending" for p in current):
        return _with_events(failure, _Verdict(C.PHASE_SUCCEEDED, C.REASON_SUCCEEDED,
                                              C.MSG_SUCCEEDED.format(count=len(succeeded)))), status
    if succeeded:  # torchrun agents finish together; wait a bounded time for the rest to exit
        finishing = _finishing(groups, status, now)
        verdict = _Verdict(C.PHASE_RUNNING, C.REASON_RUNNING, C.MSG_FINISHING.format(
            done=len(succeeded), total=len(current)), finishing.events)
        return _with_events(failure, verdict), _with(status, finishing)
    if failure.phase == C.PHASE_RESTARTING or _in_backoff(spec, current, status, now):
        return _with_events(failure, _restarting(spec, status, now, failure)), status
    return _with_events(failure, _running_or_pending(spec, current, prev_phase)), status


def _finishing(groups: NodeGroups, status: Status, now: datetime) -> _Part:
    """Training finished (a node pod exited 0) while others still run: status.finishing
    {since, stopped}, with one Event when the wait begins and one when the pods still running
    C.FINISH_GRACE_SECONDS after the first exit are stopped (plan.py deletes them)."""
    prev = status.get("finishing") or {}
    waiting = [p for p in groups.current if p.active and p.phase != "Pending"]
    first_exit = min(min(p.finished_at or now, now) for p in groups.succeeded)
    since = prev.get("since") or format_time(first_exit)
    names, events = ", ".join(p.name for p in waiting), []
    if not prev.get("since"):
        events.append(Event(C.EVENT_NORMAL, C.REASON_FINISHING, C.MSG_FINISHING_WAIT.format(
            count=len(waiting), pods=names, grace=C.FINISH_GRACE_SECONDS)))
    overdue = seconds_between(parse_time(since), now) >= C.FINISH_GRACE_SECONDS
    stopped = prev.get("stopped")
    if overdue and not stopped and waiting:
        stopped = len(waiting)
        events.append(Event(C.EVENT_WARNING, C.REASON_FINISH_STOPPED, C.MSG_FINISH_STOPPED.format(
            count=len(waiting), pods=names, grace=C.FINISH_GRACE_SECONDS)))
    finishing = {"since": since, "stopped": stopped}
    return _Part({"finishing": {k: v for k, v in finishing.items() if v is not None}}, tuple(events))


def _note_deleted(spec: DDPJobSpec, groups: NodeGroups, status: Status, now: datetime) -> _Part:
    """Node pods deleted by someone else while training (`kubectl delete pod`): listed once in
    status.failures with cause Deleted and reported in one Event. Never charged: a deleting pod
    is not counted as failed. The operator's own deletions are told apart by what it deletes:
    older generations, indexes at or above spec.replicas, failed pods, and pods after training."""
    if groups.training_over:
        return _Part()
    failures, events = status.get("failures"), []
    for pod in groups.live:
        if not (pod.deleting and not pod.is_store and pod.index is not None and pod.index < spec.node_pods
                and pod.phase in ACTIVE_PHASES and pod.disruption is None):
            continue
        listed = progress.with_failure(failures, pod, diagnose_deleted_by_someone(pod), now)
        if listed is not None:
            failures = listed
            events.append(Event(C.EVENT_WARNING, C.REASON_POD_DELETED, C.MSG_POD_DELETED.format(pod=pod.name)))
    return _Part({"failures": failures} if events else {}, tuple(events))


def _scaled(prev: Status, status: Status) -> list[Event]:
    """One Event when spec.replicas changed since the last pass (status.desiredReplicas holds the last)."""
    old, new = prev.get("desiredReplicas"), status.get("desiredReplicas")
    if old is None or new is None or old == new:
        return []
    return [Event(C.EVENT_NORMAL, C.REASON_SCALED, C.MSG_SCALED.format(
        direction="out" if new > old else "in", old=old, new=new))]


def _with_events(source: _Verdict, target: _Verdict) -> _Verdict:
    """`target`, after the Events `source` found on the way."""
    return replace(target, events=source.events + target.events)


def _suspended(spec: DDPJobSpec, groups: NodeGroups, status: Status,
               now: datetime) -> tuple[_Verdict, dict[str, Any]]:
    """Suspended; a node pod that failed on its own before this pass saw the suspension is still
    listed and counted (and fails the job when permanent or over the budget), as the pass before
    the suspension would have: what is counted must not depend on how soon the operator looked.
    The pods the suspension deletes are being deleted, and so are never counted."""
    failed = [p for p in groups.current + groups.extra if p.phase == "Failed"]
    noted = _note_failures(spec, failed, status, now)
    failure, status = _record_failures(spec, groups, _with(status, noted), now)
    if failure.phase == C.PHASE_FAILED:
        return _with_events(_Verdict("", "", "", noted.events), failure), status
    return _Verdict(C.PHASE_SUSPENDED, C.REASON_SUSPENDED, C.MSG_SUSPENDED, noted.events + failure.events), status


def _record_failures(spec: DDPJobSpec, groups: NodeGroups, status: Status,
                     now: datetime) -> tuple[_Verdict, dict[str, Any]]:
    """Count failed pods not seen before; Failed when one is permanent or the budget is spent.
    Pods above spec.replicas count too: one that failed before a scale-down was seen failed
    while it was wanted. Returns the verdict and the status with handledFailures and the ledger."""
    observed = {p.uid for p in groups.live}
    handled = [uid for uid in status["handledFailures"] if uid in observed]
    verdict = _Verdict("", "", "")
    fp = spec.failure_policy
    for pod in groups.current + groups.extra:
        uid = pod.uid
        outcome = classify_pod(pod, fp.permanent_exit_codes)
        if outcome in (None, Outcome.SUCCEEDED) or uid in handled:
            continue
        handled = handled + [uid]
        if after_finish(outcome, training_over=groups.finished_by(pod.finished_at)):  # listed in status.failures
            verdict = replace(verdict, events=verdict.events + (Event(
                C.EVENT_NORMAL, C.REASON_EXITED_AFTER_FINISH, C.MSG_EXITED_AFTER_FINISH.format(what=_describe(pod, spec))),))
            continue
        verdict, ledger = _apply_failure(spec, pod, outcome, status, now, verdict)
        status = {**status, **ledger}
    status = {**status, "handledFailures": sorted(handled)}
    status = {**status, **ledger_fields(judge(ledger_of(status), status.get("lastSnapshot")), status)}  # a group restart's too
    if verdict.phase != C.PHASE_FAILED:
        verdict = _check_budget(spec, status, verdict)
    if verdict.phase != C.PHASE_FAILED and not groups.training_over:  # a late pod's pull cannot undo training
        verdict, pulled = _check_image_pull(spec, groups, status, now, verdict)
        status = _with(status, pulled)
    return verdict, status


def _note_failures(spec: DDPJobSpec, pods: Iterable[PodView], status: Status, now: datetime) -> _Part:
    """List every failed or disrupted pod in status.failures; a pod deleted under a
    DisruptionTarget before it failed (drained, preempted, its node lost) gets its only Event here."""
    fp = spec.failure_policy
    failures, noted = progress.noted_failures(pods, status.get("failures"), now, fp.permanent_exit_codes,
                                              include_log_tail=fp.include_log_tail)
    return _Part({"failures": failures}, tuple(
        Event(C.EVENT_WARNING, C.REASON_NODE_DISRUPTED, C.MSG_NODE_DISRUPTED.format(
            what=f"node pod {pod.name} is being deleted ({diagnosis.reason or diagnosis.cause})"))
        for pod, diagnosis in noted if pod.phase != "Failed"))


def _check_budget(spec: DDPJobSpec, status: Status, verdict: _Verdict) -> _Verdict:
    """Failed when the budget passed a failurePolicy limit (budget.py); `verdict` while it holds."""
    found = limit_verdict(ledger_of(status), spec.failure_policy, status.get("lastSnapshot"), _last_failure(status))
    if found is None:
        return verdict
    reason, message = found
    return _Verdict(C.PHASE_FAILED, reason, message, verdict.events)


def _last_failure(status: Status) -> str:
    failures = [f for f in status.get("failures") or [] if f.get("cause") in (C.CAUSE_ERROR, C.CAUSE_OOM, C.CAUSE_HANG)]
    if not failures:
        return "unknown"
    last = failures[-1]
    code = f"exit code {last['exitCode']}" if last.get("exitCode") is not None else None  # a Hang has none
    detail = ", ".join(str(x) for x in (code, last.get("reason")) if x)
    return f"node pod {last.get('pod', '?')} ({detail}){': ' + last['message'] if last.get('message') else ''}"


def _check_image_pull(spec: DDPJobSpec, groups: NodeGroups, status: Status, now: datetime,
                      verdict: _Verdict) -> tuple[_Verdict, _Part]:
    """Failed when a current pod's image cannot be pulled (failure.diagnose_image_pull), with
    the pod listed in status.failures."""
    timeout = spec.failure_policy.image_pull_timeout_seconds
    for pod in groups.current:
        diagnosis = diagnose_image_pull(pod, now, timeout)
        if diagnosis is None:
            continue
        listed = progress.with_failure(status.get("failures"), pod, diagnosis, now)  # None: listed already
        invalid = diagnosis.reason in INVALID_IMAGE_REASONS
        message = C.MSG_IMAGE_PULL.format(
            pod=pod.name, image=spec.image, reason=diagnosis.reason, message=diagnosis.message or "no message",
            rule=C.MSG_IMAGE_INVALID if invalid else C.MSG_IMAGE_PULL_TIMEOUT.format(timeout=timeout))
        return (replace(verdict, phase=C.PHASE_FAILED, reason=C.REASON_IMAGE_PULL, message=message),
                _Part({"failures": listed} if listed is not None else {}))
    return verdict, _Part()


def _describe(pod: PodView, spec: DDPJobSpec | None = None) -> str:
    diagnosis = diagnose_pod(pod, spec.failure_policy.permanent_exit_codes if spec else (),
                             include_log_tail=bool(spec and spec.failure_policy.include_log_tail))
    detail = f": {diagnosis.message}" if diagnosis and diagnosis.message else ""
    return describe_exit(f"node pod {pod.name}", pod.exit_code, pod.reason) + detail


def _apply_failure(spec: DDPJobSpec, pod: PodView, outcome: Outcome, status: Status, now: datetime,
                   verdict: _Verdict) -> tuple[_Verdict, dict[str, Any]]:
    """`verdict` after one newly failed pod, and the ledger fields it changes (a new incident)."""
    what = _describe(pod, spec)
    if outcome == Outcome.PERMANENT:
        reason, message = permanent_failure(pod, what)
        return _Verdict(C.PHASE_FAILED, reason, message, verdict.events), {}
    phase = C.PHASE_FAILED if verdict.phase == C.PHASE_FAILED else C.PHASE_RESTARTING
    if not opens_incident(outcome):
        return replace(verdict, phase=phase, reason=verdict.reason or C.REASON_NODE_DISRUPTED, events=verdict.events + (
            Event(C.EVENT_WARNING, C.REASON_NODE_DISRUPTED, C.MSG_NODE_DISRUPTED.format(what=what)),)), {}
    failed_at = min(pod.finished_at or now, now)  # a skewed kubelet clock
    opened, free, ledger = open_incident(ledger_of(status), failed_at, pod.created_at), False, {}
    if opened is not None:
        judged = judge(opened, status.get("lastSnapshot"))
        free = judged.budget.with_progress > opened.budget.with_progress
        ledger = ledger_fields(judged, status)
    message = failure_message(what, ledger_of({**status, **ledger}), spec.failure_policy, free,
                              status.get("lastSnapshot"))
    # A Failed verdict keeps the reason it failed for: its message says that one, and so must its Event.
    reason = verdict.reason if verdict.phase == C.PHASE_FAILED else C.REASON_NODE_FAILED
    return replace(verdict, phase=phase, reason=reason, events=verdict.events + (
        Event(C.EVENT_WARNING, C.REASON_NODE_FAILED, message),)), ledger


def _missing_indexes(spec: DDPJobSpec, current: Iterable[PodView]) -> list[int]:
    present = {p.index for p in current if p.active or p.phase == "Succeeded"}
    return [i for i in range(spec.node_pods) if i not in present]


def _in_backoff(spec: DDPJobSpec, current: Iterable[PodView], status: Status, now: datetime) -> bool:
    return bool(_missing_indexes(spec, current)) and replacement_delay(spec, status, now) > 0


def _restarting(spec: DDPJobSpec, status: Status, now: datetime, failure: _Verdict) -> _Verdict:
    delay = replacement_delay(spec, status, now)
    reason = failure.reason or C.REASON_BACKOFF
    when = f"in {delay:.0f}s (backoff)" if delay > 0 else "now"
    return _Verdict(C.PHASE_RESTARTING, reason, C.MSG_RESTARTING.format(
        when=when, restarts=status.get("restarts", 0), max=spec.failure_policy.max_restarts))


def _running_or_pending(spec: DDPJobSpec, current: Iterable[PodView], prev_phase: str | None) -> _Verdict:
    running = sum(1 for p in current if p.active and p.phase == "Running")
    counts = dict(running=running, desired=spec.node_pods, min=spec.min_replicas,
                  max=spec.max_replicas)
    if running >= spec.min_replicas:
        return _Verdict(C.PHASE_RUNNING, C.REASON_RUNNING, C.MSG_RUNNING.format(**counts))
    if prev_phase == C.PHASE_RESTARTING:  # restarting lasts until enough replacements run
        return _Verdict(C.PHASE_RESTARTING, C.REASON_NODE_FAILED,
                        C.MSG_WAITING_FOR_REPLACEMENTS.format(**counts))
    return _Verdict(C.PHASE_PENDING, C.REASON_CREATED, C.MSG_PENDING.format(**counts))


# --- Conditions and events -----------------------------------------------------

def _conditions(prev: Status, verdict: _Verdict, now: str, invalid: bool) -> list[dict[str, Any]]:
    conditions = [dict(c) for c in prev.get("conditions") or []]
    existing = {c.get("type"): c for c in conditions}
    target = C.PHASE_CONDITION.get(verdict.phase)
    for type_ in dict.fromkeys(C.PHASE_CONDITION.values()):
        if type_ == target:
            conditions = set_condition(conditions, type_, "True", verdict.reason, verdict.message, now)
        elif existing.get(type_, {}).get("status") == "True":
            conditions = set_condition(conditions, type_, "False", verdict.reason or verdict.phase,
                                       f"the job is {verdict.phase}", now)
    if invalid:
        conditions = set_condition(conditions, C.COND_INVALID_SPEC, "True", C.REASON_INVALID_SPEC,
                                   verdict.message, now)
    elif existing.get(C.COND_INVALID_SPEC, {}).get("status") == "True":
        conditions = set_condition(conditions, C.COND_INVALID_SPEC, "False", C.REASON_SPEC_VALID,
                                   C.MSG_SPEC_VALID, now)
    return conditions


def _finished_before(prev: Status) -> bool:
    """The previous pass finished the job: its phase and conditions stay as they are."""
    return prev.get("phase") in C.FINISHED_PHASES and bool(prev.get("completionTime"))


def _phase(prev: Status, verdict: _Verdict, now: datetime, invalid: bool) -> _Part:
    """phase, the phase conditions and completionTime from the verdict, with the verdict's
    Events and one more when the phase changed (or a validation message is new)."""
    if _finished_before(prev):
        return _Part({"phase": prev["phase"], "conditions": list(prev.get("conditions") or [])})
    now_s = format_time(now)
    finished = verdict.phase in C.FINISHED_PHASES and not invalid
    changes = {"phase": verdict.phase, "conditions": _conditions(prev, verdict, now_s, invalid),
               **({"completionTime": now_s} if finished else {})}
    if not _changed(prev, verdict, invalid):
        return _Part(changes, verdict.events)
    kind = C.EVENT_WARNING if verdict.phase in (C.PHASE_FAILED, C.PHASE_RESTARTING) else C.EVENT_NORMAL
    reason = C.REASON_RESUMED if prev.get("phase") == C.PHASE_SUSPENDED else verdict.reason
    return _Part(changes, verdict.events + (Event(kind, reason, verdict.message),))


def _changed(prev: Status, verdict: _Verdict, invalid: bool) -> bool:
    """The verdict is news, and _phase posts the one Event that explains it: the phase changed,
    a validation message is new, or a job Failed for its spec now fails for what its pods did."""
    if prev.get("phase") != verdict.phase:
        return True
    old = condition_of(prev.get("conditions"), C.COND_INVALID_SPEC) or {}
    if invalid:  # a different validation message is news even if the phase stays Failed
        return old.get("message") != verdict.message
    return verdict.phase == C.PHASE_FAILED and old.get("status") == "True"


def _ordered(status: Status) -> dict[str, Any]:
    """The status model's keys in its order; unset (None) keys are left out, so a status read back
    from the API compares equal to a recomputed one (the writer nulls keys that vanished)."""
    return {k: status[k] for k in STATUS_FIELDS if status.get(k) is not None}
