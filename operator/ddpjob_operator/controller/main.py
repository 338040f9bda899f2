"""``python -m ddpjob_operator`` (console script ``ddpjob-operator``): runs the kopf operator.

Examples::

    ddpjob-operator                          # all namespaces, standalone
    ddpjob-operator --namespace team-a --namespace team-b
    ddpjob-operator --peering ddpjob --liveness-port 8080 --metrics-port 9090

With ``--peering``, the replicas must differ in priority: kopf pauses every
operator, itself included, when it sees a live peer of the same priority, which
would leave the cluster unserved. Unless ``--priority`` is given, each process
takes one from its start time so that the oldest live replica acts and the
others stand by (``standby_priority``).
"""
from __future__ import annotations

import argparse
import logging
import os
import random
import secrets
import socket
import sys
import time
from pathlib import Path
from typing import Any

import kopf

from ddpjob_rdzv import contract
from ddpjob_rdzv.process_start import stable_start_time

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.spec import MAX_REPLICAS
from ddpjob_operator.controller import kube, metrics
from ddpjob_operator.controller.peering import Peering
from ddpjob_operator.render.network_policy import OperatorPeer
from ddpjob_operator.decide import writes

DEFAULT_LIVENESS_PORT = 8080  # kubelet probes GET /healthz here
DEFAULT_METRICS_PORT = 9090  # Prometheus scrapes /metrics here
# Where a pod finds its own namespace (the service account's projected files).
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
# Milliseconds since the epoch stay below this until the year 2286; the
# difference keeps priorities positive and higher for older processes. Times the
# tie breakers, it stays below 2**53 for any start after 2001, so a client reading
# JSON numbers as doubles reads it exactly.
_PRIORITY_EPOCH_MS = 10**13
_TIE_BREAKERS = 1000
# Environment variables that set the defaults of the scaling flags (charts/ddpjob-operator sets them).
ENV_QPS = "DDPJOB_KUBE_API_QPS"
ENV_BURST = "DDPJOB_KUBE_API_BURST"
ENV_CONCURRENCY = "DDPJOB_MAX_CONCURRENT_PASSES"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="ddpjob-operator", description="Kubernetes operator for DDPJob.")
    parser.add_argument("--namespace", "-n", action="append", default=[], metavar="NS",
                        help="watch this namespace or kopf pattern such as 'team-*' (repeatable); none: all namespaces")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--standalone", action="store_true", default=True,
                      help="run without peering (default): exactly one operator replica must run")
    mode.add_argument("--peering", metavar="NAME", default=None,
                      help="coordinate with other replicas through the kopf peering object NAME")
    parser.add_argument("--priority", type=int, default=None,
                        help="kopf peering priority; the highest live one acts (default with --peering: "
                             "older processes rank higher, so one replica acts and the others stand by)")
    parser.add_argument("--liveness-port", type=int, default=DEFAULT_LIVENESS_PORT,
                        help="serve GET /healthz on this port (0: off)")
    parser.add_argument("--metrics-port", type=int, default=DEFAULT_METRICS_PORT,
                        help="serve Prometheus /metrics on this port (0: off)")
    parser.add_argument("--progress-poll-seconds", type=float, default=C.PROGRESS_POLL_SECONDS, metavar="S",
                        help="read a running job's progress from its pods this often (0: only from "
                             "termination messages, e.g. when NetworkPolicies keep the operator out)")
    parser.add_argument("--status-write-interval-seconds", type=float, default=writes.DEFAULT_INTERVAL_SECONDS,
                        metavar="S",
                        help="write a training job's routine progress (step, snapshot, hang clock) to its status "
                             "at most this often; phases, failures, hangs and stragglers are written at once "
                             "(0: every change at once; default: %(default)s, 1,000 jobs at <= 2 writes/s)")
    parser.add_argument("--operator-pod-selector", default=f"{C.LABEL_APP_NAME}={C.OPERATOR_APP_NAME}",
                        metavar="KEY=VALUE[,KEY=VALUE]",
                        help="labels of this operator's pods: each job's NetworkPolicy lets only such pods "
                             "read the trainers' progress port (default: %(default)s)")
    parser.add_argument("--operator-namespace", default=None, metavar="NS",
                        help="namespace of this operator's pods, for the same rule (default: the pod's own "
                             "namespace when run in a cluster, else any namespace)")
    parser.add_argument("--max-replicas", type=int, default=C.DEFAULT_MAX_REPLICAS, metavar="N",
                        help="refuse DDPJobs whose replicas, minReplicas or maxReplicas exceed N (condition "
                             "InvalidSpec): each pass holds all of a job's pods in memory (default: %(default)s)")
    parser.add_argument("--kube-api-qps", type=float, default=_env_number(ENV_QPS, kube.DEFAULT_QPS), metavar="Q",
                        help=f"API requests per second, after a burst (0: no limit; env {ENV_QPS}; "
                             "default: %(default)s, as Kubeflow's and kube-controller-manager's)")
    parser.add_argument("--kube-api-burst", type=int, default=_env_number(ENV_BURST, kube.DEFAULT_BURST), metavar="N",
                        help=f"API requests allowed at once before --kube-api-qps applies (env {ENV_BURST}; "
                             "default: %(default)s)")
    parser.add_argument("--max-concurrent-passes", type=int, metavar="N",
                        default=_env_number(ENV_CONCURRENCY, kube.DEFAULT_CONCURRENT_PASSES),
                        help=f"reconcile passes running at once, over all jobs (env {ENV_CONCURRENCY}; "
                             "default: %(default)s); see docs/scaling.md")
    parser.add_argument("--verbose", "-v", action="store_true", help="log every API call and handler")
    args = parser.parse_args(argv)
    if args.progress_poll_seconds < 0:
        parser.error(f"--progress-poll-seconds ({args.progress_poll_seconds}) must be 0 (off) or more")
    if args.status_write_interval_seconds < 0:
        parser.error(f"--status-write-interval-seconds ({args.status_write_interval_seconds:g}) must be 0 "
                     "(write every change) or more")
    if args.kube_api_qps < 0:
        parser.error(f"--kube-api-qps ({args.kube_api_qps:g}) must be 0 (no limit) or more")
    if args.kube_api_burst < 1:
        parser.error(f"--kube-api-burst ({args.kube_api_burst}) must be 1 or more")
    if args.max_concurrent_passes < 1:
        parser.error(f"--max-concurrent-passes ({args.max_concurrent_passes}) must be 1 or more")
    if not 1 <= args.max_replicas <= MAX_REPLICAS:
        parser.error(f"--max-replicas ({args.max_replicas}) must be 1..{MAX_REPLICAS}, the CRD's own maximum")
    if args.priority is not None and args.peering is None:
        parser.error("--priority only matters with --peering NAME: a standalone operator has no peers to rank against")
    if args.peering is not None and not watched_namespaces(args.namespace) and args.namespace:
        parser.error(f"--peering with a namespace pattern ({', '.join(args.namespace)}) is not supported: the "
                     "replicas follow one peering object per namespace; name the namespaces")
    for port_flag in ("liveness_port", "metrics_port"):
        if not 0 <= getattr(args, port_flag) <= 65535:
            parser.error(f"--{port_flag.replace('_', '-')} ({getattr(args, port_flag)}) must be 0..65535")
    try:
        args.operator_peer = operator_peer(args.operator_pod_selector, args.operator_namespace)
    except ValueError as e:
        parser.error(str(e))
    return args


def liveness_endpoint(port: int, host: str = "") -> str | None:
    """kopf's /healthz URL (None for port 0): on ``host``, ddpjob's listen address (contract.listen_host;
    every interface when ""), so two operator pods that share a host's network (the sandbox's
    kubelets) each serve their own address."""
    if not port:
        return None
    address = f"[{host}]" if ":" in host else (host or "0.0.0.0")
    return f"http://{address}:{port}/healthz"


def _env_number(name: str, default: float) -> Any:
    """A flag's default from the environment (the chart sets these), else ``default``; the
    flag's own check reports a bad value."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return type(default)(raw)
    except ValueError:
        raise SystemExit(f"ddpjob-operator: error: {name} ({raw!r}) must be a number") from None


def watched_namespaces(namespaces: list[str]) -> tuple[str, ...]:
    """The namespaces the cache watches one by one: the exact ones given. None given, or any
    kopf pattern among them ('team-*'): () watches across all namespaces, as kopf does."""
    if not namespaces or any(set(ns) & set("*?[!") for ns in namespaces):
        return ()
    return tuple(namespaces)


def operator_peer(selector: str, namespace: str | None) -> OperatorPeer:
    """The operator's pods as the jobs' NetworkPolicies admit them.

    Raises:
        ValueError: the selector is not a non-empty list of KEY=VALUE pairs.
    """
    pairs = [item.strip().split("=", 1) for item in selector.split(",") if item.strip()]
    if not pairs or any(len(pair) != 2 or not pair[0] or not pair[1] for pair in pairs):
        raise ValueError(f"--operator-pod-selector ({selector!r}) must be KEY=VALUE[,KEY=VALUE...], "
                         "the labels of the operator's pods")
    if namespace is None:
        namespace = SERVICE_ACCOUNT_NAMESPACE.read_text().strip() if SERVICE_ACCOUNT_NAMESPACE.is_file() else ""
    return OperatorPeer(tuple((key, value) for key, value in pairs), namespace)


def standby_priority(started_at: float, tie_breaker: int = 0) -> int:
    """A peering priority from a process start time (seconds): older processes rank higher.

    The incumbent keeps acting while a rollout or a second replica starts, as
    a leader keeps its lease; a replacement takes over once the incumbent has
    left the peering object (at once on a clean exit, after kopf's peering
    lifetime when it died without one). ``tie_breaker`` (0-999) orders two
    processes that started in the same millisecond, which kopf would otherwise
    both pause; it never reorders processes a millisecond or more apart.
    """
    if not 0 <= tie_breaker < _TIE_BREAKERS:
        raise ValueError(f"tie_breaker ({tie_breaker}) must be in 0..{_TIE_BREAKERS - 1}")
    return (_PRIORITY_EPOCH_MS - int(started_at * 1000)) * _TIE_BREAKERS + tie_breaker


def own_start_time() -> float:
    """This process's start (ddpjob_rdzv.process_start.stable_start_time), not the moment after
    its imports: under load, imports take seconds, and a replica started first but slower to import
    would rank below the other. Outside Linux (no /proc), the time of this call."""
    try:
        return stable_start_time()
    except OSError:
        return time.time()


def settings_for(args: argparse.Namespace) -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    # With exact namespaces there is nothing to discover: skip the cluster-wide namespace and
    # CRD scans, which would need cluster-scoped RBAC the namespaced install does not grant.
    # kopf's patterns ("team-*", "!kube-*") still need the namespace scan to be resolved.
    patterns = [ns for ns in args.namespace if set(ns) & set("*?[!")]
    settings.scanning.disabled = bool(args.namespace) and not patterns
    # Events are posted by the operator itself (kube.post_event) only when something changed;
    # kopf's per-handler "Handler succeeded" events would bury them.
    settings.posting.level = 100
    # Progress of retried handlers goes in annotations only: the status belongs to the job.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage()
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage()
    if args.peering is not None:
        settings.peering.priority = (args.priority if args.priority is not None
                                     else standby_priority(own_start_time(), random.randrange(_TIE_BREAKERS)))
    return settings


def peering_identity() -> str:
    """This replica's name in the peering object: the pod's (POD_ID, as kopf reads it; the chart
    sets it), else host, process and a random part. main.py hands it to kopf and to the
    operator's own view of the object (peering.PeeringView), which must find itself there."""
    return os.environ.get("POD_ID") or f"{socket.gethostname()}/{os.getpid()}/{secrets.token_hex(3)}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import ddpjob_operator.controller.handlers  # noqa: F401  (registers the handlers with kopf)

    kopf.configure(verbose=args.verbose, debug=args.verbose)
    host = contract.listen_host()
    metrics.serve(args.metrics_port, host)
    settings = settings_for(args)
    peering = None
    if args.peering is not None:
        peering = Peering(args.peering, peering_identity(), settings.peering.priority, tuple(args.namespace))
        logging.getLogger("ddpjob_operator").info(
            "peering through %r as %s with priority %d: the highest live priority acts, the others stand by",
            args.peering, peering.identity, peering.priority)
    kopf.run(
        settings=settings,
        memo=kopf.Memo(progress_poll_seconds=args.progress_poll_seconds,
                       status_write_interval_seconds=args.status_write_interval_seconds, operator_peer=args.operator_peer,
                       max_replicas=args.max_replicas, kube_api_qps=args.kube_api_qps,
                       kube_api_burst=args.kube_api_burst, max_concurrent_passes=args.max_concurrent_passes,
                       watched_namespaces=watched_namespaces(args.namespace), peering=peering),
        standalone=args.peering is None,
        peering_name=args.peering,
        identity=peering.identity if peering is not None else None,
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        liveness_endpoint=liveness_endpoint(args.liveness_port, host),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
