"""Prometheus metrics of the operator, served on ``--metrics-port`` (0 turns the endpoint off).

Names follow Prometheus conventions (``_total`` counters, ``_seconds`` histograms, base units)
and are prefixed with ``ddpjob_operator_`` so they do not clash with the trainer's metrics.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import prometheus_client

from ddpjob_operator import constants as C

REGISTRY = prometheus_client.CollectorRegistry()  # our own: no process/platform collectors mixed in

JOBS = prometheus_client.Gauge(
    "ddpjob_operator_jobs", "DDPJobs this operator last saw, by status.phase", ["phase"], registry=REGISTRY)
POD_REPLACEMENTS = prometheus_client.Counter(
    "ddpjob_operator_pod_replacements_total", "Failed node pods the operator replaced (status.restarts increments)",
    registry=REGISTRY)
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
    if phase is None:
        _job_phases.pop((namespace, name), None)
    else:
        _job_phases[(namespace, name)] = phase
    for each in set(_PHASES) | set(_job_phases.values()):
        JOBS.labels(phase=each).set(sum(1 for p in _job_phases.values() if p == each))


def observe_restarts(before: int, after: int) -> None:
    if after > before:
        POD_REPLACEMENTS.inc(after - before)


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


def serve(port: int) -> None:
    """Starts the /metrics HTTP endpoint in a background thread (no-op for port 0)."""
    if port:
        prometheus_client.start_http_server(port, registry=REGISTRY)
