"""What the trainer's progress records and the failed pods tell the status (pure).

The trainer's local-rank-0 worker on every node keeps a progress record in its termination
message (ddpjob_trainer/report/record.py); the kubelet publishes it in the pod status when
the container exits. From the records of all observed pods this module keeps:

  * ``status.lastSnapshot`` {epoch, step, time, path}: the newest complete snapshot;
  * ``status.recovery``: the newest resume seen (``lastResume``), the time from the last
    failure incident to the first step after it (``lastRecoverySeconds``), the training
    time lost so far (``lostSeconds``: for every run after the first, from the snapshot it
    resumed from, or from the job's start, to its first step; work redone after a resume and
    restart overheads both count) and the first run's start-up (``startupSeconds``, the same
    span for the first run when no failure came before it). ``accountedRestarts`` and ``snapshotAtLastFailure`` are the
    bookkeeping of the restart budget by progress (budget.py);
  * ``status.failures``: the newest failed or disrupted node pods, explained (failure.diagnose_pod);
  * ``status.invalidProgressRecords`` [{pod, podUID, field, time}]: records the contract refused
    (ddpjob_rdzv/contract/progress_record.py), each reported once in a Warning Event, at most one per pod
    per C.INVALID_RECORD_WARNING_SECONDS.

Records arrive when a container exits, and while a job runs from each node's progress
endpoint, which the operator polls (live_progress.py); where the operator cannot reach pods,
a running job's figures trail until its next failure or its end. A refused record is
dropped: it never stops a pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterable, Mapping

from ddpjob_rdzv.contract import progress_record

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.clock import format_time, parse_time, seconds_between
from ddpjob_operator.decide.actions import Event
from ddpjob_operator.decide.budget import newer_snapshot
from ddpjob_operator.decide import failure
from ddpjob_operator.decide.failure import Diagnosis, diagnose_deleted, diagnose_pod
from ddpjob_operator.decide.observed import PodView, RecordProblem

SNAPSHOT_KEYS = ("epoch", "step", "time", "path")  # status.lastSnapshot (the contract's fields)


@dataclass(frozen=True)
class Ingested:
    """What the records tell the status: fields to merge over it, and Warnings to post."""

    changes: dict[str, Any]  # lastSnapshot, recovery, invalidProgressRecords
    events: list[Event]


def ingest(pods: Iterable[PodView], status: Mapping[str, Any],
           live: Iterable[Mapping[str, Any] | RecordProblem] = (), created: datetime | None = None,
           now: datetime | None = None) -> Ingested:
    """lastSnapshot and recovery from every record found (in the pods' termination messages,
    and ``live`` ones read from running pods); idempotent per record. Records the contract
    refused are left out, with a Warning Event for each one not reported before (see
    record_problems). ``created``: the job's creationTimestamp (a snapshot older than it is an
    earlier job's); ``now``: the pass's clock."""
    pods, live = list(pods), list(live)
    records = [r for pod in pods for r in pod.progress] + [r for r in live if not isinstance(r, RecordProblem)]
    last = status.get("lastSnapshot")
    for record in records:
        snapshot = record.get("snapshot")
        if isinstance(snapshot, Mapping) and newer_snapshot(snapshot, last):
            last = {k: snapshot[k] for k in SNAPSHOT_KEYS if snapshot.get(k) is not None}
    resumes = [r["resume"] for r in records if isinstance(r.get("resume"), Mapping)
               and parse_time(r["resume"].get("firstStepTime")) and parse_time(r["resume"].get("time"))]
    recovery, earlier = earlier_job_resume(resumes, dict(status.get("recovery") or {}), created)
    for resume in sorted(resumes, key=lambda r: parse_time(r["time"])):
        recovery = _with_resume(recovery, resume, status)
    problems = [RecordProblem.of(pod, C.SOURCE_TERMINATION_MESSAGE, invalid) for pod in pods
                for invalid in pod.record_problems] + [p for p in live if isinstance(p, RecordProblem)]
    reported, events = record_problems(pods, problems, status.get("invalidProgressRecords"), now)
    restarts, restart_events = worker_restarts(pods, live, status)
    return Ingested({"lastSnapshot": last, "recovery": recovery or None, "invalidProgressRecords": reported,
                     **restarts}, events + restart_events + earlier)


def identity_problem(record: Mapping[str, Any], pod: PodView) -> progress_record.Invalid | None:
    """Why a record read from ``pod``'s progress endpoint is not that pod's: it names another job
    (``jobUID``, the pod's controller uid) or another pod (``pod``). The endpoint is reached by pod
    IP, and an IP freed by one pod is soon another's, of this job or any other; a record that
    says whose it is must say ours. Records of older trainers name neither and are accepted."""
    for field, expected in (("jobUID", pod.controller_uid), ("pod", pod.name)):
        found = record.get(field)
        if found is not None and expected and found != expected:
            return progress_record.Invalid(field, progress_record.shorten(f'"{found}"'),
                                           f'must be "{expected}": the record of another job or pod')
    return None


def earlier_job_resume(resumes: list[Mapping[str, Any]], recovery: dict[str, Any],
                       created: datetime | None) -> tuple[dict[str, Any], list[Event]]:
    """``recovery`` with ``resumedFromEarlierJob`` set, and one Event, the first time a run resumed
    from a snapshot completed before the job was created: a job re-applied under the same name,
    or a new one on the same claim, continues from what an earlier job left there (by design),
    and a user who expected a fresh start must be able to see why it did not."""
    if created is None or recovery.get("resumedFromEarlierJob"):
        return recovery, []
    for resume in resumes:
        snapshot_time = parse_time(resume.get("fromSnapshotTime"))
        if snapshot_time is not None and snapshot_time < created:
            recovery = {**recovery, "resumedFromEarlierJob": {
                "time": resume["fromSnapshotTime"], "fromStep": resume.get("fromStep")}}
            return recovery, [Event(C.EVENT_NORMAL, C.REASON_RESUMED_FROM_EARLIER_JOB,
                                    C.MSG_RESUMED_FROM_EARLIER_JOB.format(step=resume.get("fromStep"),
                                                                          time=resume["fromSnapshotTime"]))]
    return recovery, []


def worker_restarts(pods: list[PodView], live: list[Mapping[str, Any] | RecordProblem],
                    status: Mapping[str, Any]) -> tuple[dict[str, Any], list[Event]]:
    """torchrun's in-pod restarts of the workers, from the records' ``resume.workerRestarts``
    (TORCHELASTIC_RESTART_COUNT): ``status.workerRestarts`` counts every one seen, and
    ``status.workerRestartsByPod`` [{pod, podUID, count}] keeps each observed pod's newest count
    (pruned to observed pods, so it stays bounded) to tell a new restart from one counted; one
    Event per pod and pass whose count went up. A live record names its pod by node index."""
    known = {e.get("podUID"): int(e.get("count") or 0) for e in status.get("workerRestartsByPod") or []}
    by_index = {p.index: p for p in pods if p.active and p.index is not None}
    seen: dict[str, tuple[PodView, int]] = {}
    for pod, record in [(p, r) for p in pods for r in p.progress] + [
            (by_index.get(_index(r)), r) for r in live if not isinstance(r, RecordProblem)]:
        count = ((record.get("resume") or {}).get("workerRestarts") if pod is not None else None) or 0
        if count and count > seen.get(pod.uid, (pod, 0))[1]:
            seen[pod.uid] = (pod, count)
    total, events = int(status.get("workerRestarts") or 0), []
    for uid, (pod, count) in seen.items():
        if count > known.get(uid, 0):
            total += count - known.get(uid, 0)
            events.append(Event(C.EVENT_NORMAL, C.REASON_WORKER_RESTART, C.MSG_WORKER_RESTART.format(
                pod=pod.name, count=count)))
    observed = {p.uid for p in pods}
    counts = {**{u: c for u, c in known.items() if u in observed}, **{u: c for u, (_, c) in seen.items()}}
    names = {p.uid: p.name for p in pods}
    kept = [{"pod": names[u], "podUID": u, "count": max(c, known.get(u, 0))} for u, c in counts.items() if c]
    return {"workerRestarts": total or None, "workerRestartsByPod": kept or None}, events


def _index(record: Mapping[str, Any]) -> int | None:
    node = record.get("node")
    return int(node) if isinstance(node, str) and node.isdigit() else None


def record_problems(pods: Iterable[PodView], problems: Iterable[RecordProblem],
                    reported: Iterable[Mapping[str, Any]] | None,
                    now: datetime | None = None) -> tuple[list[dict[str, Any]] | None, list[Event]]:
    """status.invalidProgressRecords with the new problems, and a Warning Event for each refused
    record whose (pod, field) is not listed yet: a termination message stays in the pod and an
    endpoint is polled every pass, so without the list each pass would warn again.

    A pod whose endpoint sends a fresh field every time (an unknown key it makes up) would still
    grow the list and post an Event per poll: so the endpoint's refusals get one entry and one
    Event per pod per C.INVALID_RECORD_WARNING_SECONDS; one within that is neither listed nor
    reported, and is once the time is over if the pod still sends it. A termination message is
    not held back: it is read once per container exit (node pods never restart in place), so it
    adds at most its two records (current and last state) over a pod's life, and holding it back
    would often lose it (the failed pod is replaced, and its entries go with it). The list keeps
    the newest C.MAX_RECORD_PROBLEMS_KEPT; entries of pods no longer observed are dropped.
    """
    observed = {p.uid for p in pods}
    kept = [dict(e) for e in reported or [] if e.get("podUID") in observed]
    seen = {(e.get("podUID"), e.get("field")) for e in kept}
    last = _last_warnings(kept)
    events = []
    for problem in problems:
        if (problem.uid, problem.invalid.field) in seen:
            continue
        if problem.source == C.SOURCE_PROGRESS_ENDPOINT and _warned_lately(last.get(problem.uid), now):
            continue
        seen.add((problem.uid, problem.invalid.field))
        last[problem.uid] = now
        entry = {"pod": problem.pod, "podUID": problem.uid, "field": problem.invalid.field}
        kept.append(entry | ({"time": format_time(now)} if now is not None else {}))
        events.append(Event(C.EVENT_WARNING, C.REASON_INVALID_PROGRESS_RECORD, C.MSG_INVALID_PROGRESS_RECORD.format(
            pod=problem.pod, source=problem.source, problem=problem.invalid.message)))
    return kept[-C.MAX_RECORD_PROBLEMS_KEPT:] or None, events


def _last_warnings(entries: Iterable[Mapping[str, Any]]) -> dict[str, datetime | None]:
    """The newest warning time of each pod listed (the list keeps the newest entries)."""
    last: dict[str, datetime | None] = {}
    for entry in entries:
        when = parse_time(entry.get("time"))
        if when is not None and (last.get(entry.get("podUID")) or when) <= when:
            last[entry.get("podUID")] = when
    return last


def _warned_lately(last: datetime | None, now: datetime | None) -> bool:
    return last is not None and now is not None and seconds_between(last, now) < C.INVALID_RECORD_WARNING_SECONDS


def _with_resume(recovery: dict[str, Any], resume: Mapping[str, Any], status: Mapping[str, Any]) -> dict[str, Any]:
    """`recovery` with a run's lead time counted once. Runs are told apart by start time: every
    node of one run starts before any node's first step (the first step is a collective), and a
    later run starts after an earlier run's first step."""
    last = recovery.get("lastResume") or {}
    started, first_step = parse_time(resume["time"]), parse_time(resume["firstStepTime"])
    if last and started <= parse_time(last["firstStepTime"]):
        return recovery
    recovery = dict(recovery)
    origin = parse_time(resume.get("fromSnapshotTime")) or parse_time(status.get("startTime"))
    started_job = parse_time(status.get("startTime"))
    if origin is not None and started_job is not None and origin < started_job:
        origin = started_job  # an earlier job's snapshot (earlier_job_resume): its age is not this job's loss
    # The first run's lead time is start-up, not a loss: it would have been spent without any failure.
    key = "lostSeconds" if last or status.get("lastFailureTime") else "startupSeconds"
    if origin is not None and first_step > origin:
        recovery[key] = round(float(recovery.get(key) or 0) + seconds_between(origin, first_step), 3)
    failed = parse_time(status.get("lastFailureTime"))
    if failed is not None and first_step > failed and recovery.get("recoveredFailureTime") != status["lastFailureTime"]:
        recovery["lastRecoverySeconds"] = round(seconds_between(failed, first_step), 3)
        recovery["recoveredFailureTime"] = status["lastFailureTime"]
    recovery["lastResume"] = {k: resume.get(k) for k in ("time", "firstStepTime", "fromStep")}
    return recovery


# --- status.failures ------------------------------------------------------------------------

def noted_failures(pods: Iterable[PodView], failures: Iterable[Mapping[str, Any]] | None, now: datetime,
                   permanent_exit_codes: Iterable[int] = (), *, include_log_tail: bool = False
                   ) -> tuple[list[dict[str, Any]] | None, list[tuple[PodView, Diagnosis]]]:
    """status.failures with the failed and disrupted pods not listed yet (newest last, at most
    C.MAX_FAILURES_KEPT; None while there is none), and the new ones. ``include_log_tail``:
    failurePolicy.includeLogTail."""
    failures, new = [dict(f) for f in failures or []], []
    for pod in pods:
        diagnosis = (diagnose_pod(pod, permanent_exit_codes, include_log_tail=include_log_tail)
                     or diagnose_deleted(pod, include_log_tail=include_log_tail))
        if diagnosis is not None and (listed := with_failure(failures, pod, diagnosis, now)) is not None:
            failures = listed
            new.append((pod, diagnosis))
    return failures or None, new


def with_failure(failures: Iterable[Mapping[str, Any]] | None, pod: PodView, diagnosis: Diagnosis,
                 now: datetime) -> list[dict[str, Any]] | None:
    """status.failures with `pod` listed; None when it is there already (by uid)."""
    failures = [dict(f) for f in failures or []]
    if pod.uid in {f.get("podUID") for f in failures}:
        return None
    return (failures + [failure_entry(pod, diagnosis, now)])[-C.MAX_FAILURES_KEPT:]


def failure_entry(pod: PodView, diagnosis: Diagnosis, now: datetime) -> dict[str, Any]:
    """The entry of a failed or disrupted pod: when it finished (else now), and its exit code."""
    return failure.failure_entry(pod, diagnosis.cause, diagnosis.reason, diagnosis.message, pod.finished_at or now,
                                 exitCode=diagnosis.exit_code)
