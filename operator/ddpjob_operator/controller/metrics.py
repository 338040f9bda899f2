"""Prometheus metrics of the operator, served on ``--metrics-port`` (0 turns the endpoint off).

Names follow Prometheus conventions (``_total`` counters, ``_seconds`` histograms, base units)
and are prefixed with ``ddpjob_operator_`` so they do not clash with the trainer's metrics.

Recovery metrics come from the status the operator writes (progress.py), so they share its
limits (docs/recovery.md): the trainer's progress records arrive from the pods' progress
endpoints every --progress-poll-seconds and when a container exits, so figures trail training
by up to one poll (or, where the operator cannot reach pods, until the next failure or the end;
goodput is then an upper bound while a job runs). Counters count what this operator process saw;
a restarted operator starts them at zero (Prometheus' rate() copes with that).
"""
from __future__ import annotations

import datetime
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import prometheus_client

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.clock import parse_time
from ddpjob_operator.api.spec import DDPJobSpec
from ddpjob_operator.decide.budget import BUDGETS, budget_use

REGISTRY = prometheus_client.CollectorRegistry()  # our own: no process/platform collectors mixed in

JOBS = prometheus_client.Gauge(
    "ddpjob_operator_jobs", "DDPJobs this operator last saw, by status.phase", ["phase"], registry=REGISTRY)
POD_REPLACEMENTS = prometheus_client.Counter(
    "ddpjob_operator_pod_replacements_total", "Failed node pods the operator replaced (status.restarts increments)",
    registry=REGISTRY)
NODE_FAILURES = prometheus_client.Counter(
    "ddpjob_operator_node_failures_total", "Failed or disrupted node pods, by status.failures[].cause "
    "(Error, OOMKilled, PermanentExitCode, Disrupted, NodeLost)", ["cause"], registry=REGISTRY)
RESTARTS = prometheus_client.Counter(
    "ddpjob_operator_restarts_total", "Failure incidents, by whether a newer snapshot was complete "
    "(progress=true: not charged to maxRestarts; false: charged; unknown: no progress report yet)",
    ["progress"], registry=REGISTRY)
TIME_TO_RECOVER = prometheus_client.Histogram(
    "ddpjob_operator_time_to_recover_seconds", "From a failure incident to the first training step "
    "after it (status.recovery.lastRecoverySeconds), observed when the trainer's record arrives",
    buckets=(5, 10, 20, 30, 60, 120, 300, 600, 1200, 3600), registry=REGISTRY)
LOST_SECONDS = prometheus_client.Gauge(
    "ddpjob_operator_lost_training_seconds", "Training time lost so far per job: for each run, from "
    "the snapshot it resumed from (or the job's start) to its first step (status.recovery.lostSeconds)",
    ["namespace", "name"], registry=REGISTRY)
GOODPUT = prometheus_client.Gauge(
    "ddpjob_operator_goodput_ratio", "1 - lostSeconds / (now or completionTime - startTime): the share "
    "of wall time that produced training kept in snapshots; set once the trainer reported a run",
    ["namespace", "name"], registry=REGISTRY)
SLOWDOWN = prometheus_client.Gauge(
    "ddpjob_operator_straggler_slowdown_ratio", "The job's step time over what it would be if its slowest "
    "node kept pace with the median node (status.progress.slowdown; 1: no straggler)",
    ["namespace", "name", "node"], registry=REGISTRY)
JOB_PHASE = prometheus_client.Gauge(
    "ddpjob_operator_job_phase", "1 for each job under its status.phase (one series per job: the "
    "previous phase's series goes when the phase changes)", ["namespace", "name", "phase"], registry=REGISTRY)
BUDGET_USED = prometheus_client.Gauge(
    "ddpjob_operator_restart_budget_used", "Failure incidents charged against a failurePolicy limit, by "
    "the limit's field (budget=maxRestarts: incidents without a newer snapshot; maxRestartsWithoutProgress: "
    "such incidents in a row); one more than the limit fails the job", ["namespace", "name", "budget"],
    registry=REGISTRY)
BUDGET_LIMIT = prometheus_client.Gauge(
    "ddpjob_operator_restart_budget_limit", "The failurePolicy limit itself (spec.failurePolicy.<budget>); "
    "maxRestartsWithoutProgress only when the spec sets one", ["namespace", "name", "budget"], registry=REGISTRY)
STEP_ADVANCED = prometheus_client.Gauge(
    "ddpjob_operator_step_advanced_timestamp_seconds", "When the operator last saw the job's training step "
    "advance or a new run start (status.progress.advancedTime, Unix time); time() minus it is how long "
    "training has stood still, as the hang detector sees it", ["namespace", "name"], registry=REGISTRY)
RECONCILE_SECONDS = prometheus_client.Histogram(
    "ddpjob_operator_reconcile_seconds", "Duration of one reconciliation pass of one job",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10), registry=REGISTRY)
RECONCILE_ERRORS = prometheus_client.Counter(
    "ddpjob_operator_reconcile_errors_total", "Reconciliation passes that ended in an error", registry=REGISTRY)

_PHASES = (C.PHASE_PENDING, C.PHASE_RUNNING, C.PHASE_RESTARTING, C.PHASE_SUCCEEDED, C.PHASE_FAILED,
           C.PHASE_SUSPENDED)
_job_phases: dict[tuple[str, str], str] = {}


def observe_job(namespace: str, name: str, phase: str | None) -> None:
    """Records a job's phase (None: the job is gone) and refreshes the per-phase gauge."""
    previous = _job_phases.get((namespace, name))
    if previous is not None and previous != phase:
        _remove(JOB_PHASE, namespace, name, previous)
    if phase is None:
        _job_phases.pop((namespace, name), None)
        for gauge in (LOST_SECONDS, GOODPUT, STEP_ADVANCED):
            _remove(gauge, namespace, name)
        for budget in BUDGETS:
            _remove(BUDGET_USED, namespace, name, budget)
            _remove(BUDGET_LIMIT, namespace, name, budget)
        _clear_slowdown(namespace, name)
    else:
        _job_phases[(namespace, name)] = phase
        JOB_PHASE.labels(namespace=namespace, name=name, phase=phase).set(1)
    for each in set(_PHASES) | set(_job_phases.values()):
        JOBS.labels(phase=each).set(sum(1 for p in _job_phases.values() if p == each))


def _remove(gauge: prometheus_client.Gauge, *labels: str) -> None:
    try:
        gauge.remove(*labels)
    except KeyError:  # never set for this job
        pass


def observe_budget(namespace: str, name: str, status: Mapping, spec: DDPJobSpec | None) -> None:
    """Sets the job's restart-budget gauges from its status and failurePolicy (an invalid spec,
    None, has no limits: its gauges stay as they were)."""
    if spec is None:
        return
    use = budget_use(status, spec.failure_policy)
    for budget in BUDGETS:
        if budget not in use:  # the limit was taken off (maxRestartsWithoutProgress: null)
            _remove(BUDGET_USED, namespace, name, budget)
            _remove(BUDGET_LIMIT, namespace, name, budget)
            continue
        used, limit = use[budget]
        BUDGET_USED.labels(namespace=namespace, name=name, budget=budget).set(used)
        BUDGET_LIMIT.labels(namespace=namespace, name=name, budget=budget).set(limit)


def observe_step_advanced(namespace: str, name: str, status: Mapping) -> None:
    """Sets when the job's step last advanced; the series goes while no step of the run is known."""
    advanced = parse_time((status.get("progress") or {}).get("advancedTime"))
    if advanced is None:
        _remove(STEP_ADVANCED, namespace, name)
    else:
        STEP_ADVANCED.labels(namespace=namespace, name=name).set(advanced.timestamp())


def observe_restarts(before: int, after: int) -> None:
    if after > before:
        POD_REPLACEMENTS.inc(after - before)


def observe_status_change(old: Mapping, new: Mapping) -> None:
    """Counts what a status write added: failures by cause, incidents by progress, a recovery."""
    seen = {f.get("podUID") for f in old.get("failures") or []}
    for failure in new.get("failures") or []:
        if failure.get("podUID") not in seen:
            NODE_FAILURES.labels(cause=failure.get("cause") or "Unknown").inc()
    incidents = int(new.get("restarts") or 0) - int(old.get("restarts") or 0)
    with_progress = int(new.get("restartsWithProgress") or 0) - int(old.get("restartsWithProgress") or 0)
    if incidents > 0:
        if with_progress > 0:
            RESTARTS.labels(progress="true").inc(with_progress)
        if incidents - with_progress > 0:
            RESTARTS.labels(progress="false" if new.get("lastSnapshot") else "unknown").inc(incidents - with_progress)
    old_recovery, new_recovery = old.get("recovery") or {}, new.get("recovery") or {}
    if new_recovery.get("recoveredFailureTime") not in (None, old_recovery.get("recoveredFailureTime")):
        TIME_TO_RECOVER.observe(float(new_recovery["lastRecoverySeconds"]))


def goodput(status: Mapping, now: datetime.datetime) -> float | None:
    """1 - lostSeconds / wall time since startTime (until completionTime); None before any report."""
    recovery = status.get("recovery") or {}
    start, end = parse_time(status.get("startTime")), parse_time(status.get("completionTime")) or now
    if not recovery.get("lastResume") or start is None or end <= start:
        return None
    wall = (end - start).total_seconds()
    return min(1.0, max(0.0, 1.0 - float(recovery.get("lostSeconds") or 0) / wall))


def observe_goodput(namespace: str, name: str, status: Mapping, now: datetime.datetime) -> None:
    """Refreshes the per-job lost-time, goodput and slowdown gauges (every pass: wall time grows)."""
    observe_slowdown(namespace, name, status)
    ratio = goodput(status, now)
    if ratio is None:
        return
    LOST_SECONDS.labels(namespace=namespace, name=name).set(float((status.get("recovery") or {}).get("lostSeconds") or 0))
    GOODPUT.labels(namespace=namespace, name=name).set(ratio)


_slowest: dict[tuple[str, str], str] = {}  # the node each job's slowdown gauge is labelled with


def observe_slowdown(namespace: str, name: str, status: Mapping) -> None:
    """Sets the job's slowdown gauge under its slowest node (the old node's series goes)."""
    progress = status.get("progress") or {}
    node, slowdown = progress.get("slowestNode"), progress.get("slowdown")
    if _slowest.get((namespace, name)) != node:
        _clear_slowdown(namespace, name)
    if node is not None and slowdown is not None:
        _slowest[(namespace, name)] = node
        SLOWDOWN.labels(namespace=namespace, name=name, node=node).set(float(slowdown))


def _clear_slowdown(namespace: str, name: str) -> None:
    node = _slowest.pop((namespace, name), None)
    if node is not None:
        _remove(SLOWDOWN, namespace, name, node)


@contextmanager
def timed_pass() -> Iterator[None]:
    """Times one reconciliation pass and counts it as an error when it raises."""
    started = time.perf_counter()
    try:
        yield
    except BaseException:
        RECONCILE_ERRORS.inc()
        raise
    finally:
        RECONCILE_SECONDS.observe(time.perf_counter() - started)


def serve(port: int, host: str = "") -> None:
    """Starts the /metrics HTTP endpoint in a background thread (no-op for port 0), on ``host``
    (ddpjob's listen address, contract.listen_host; every interface when "")."""
    if port:
        prometheus_client.start_http_server(port, addr=host or "0.0.0.0", registry=REGISTRY)
