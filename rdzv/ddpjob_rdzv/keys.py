"""Names of the etcd keys of one rendezvous; every key of a run lives under ``run_prefix``.

    /ddpjob/rdzv/<namespace>/<run_id>/state                     torch's pickled rendezvous state
    /ddpjob/rdzv/<namespace>/<run_id>/store/<generation>/<key>  the c10d store the agents share

``namespace`` is the job's Kubernetes namespace (the trainer reads it from
``DDPJOB_NAMESPACE``, which the operator sets in every node pod); runs outside a
cluster use ``LOCAL_NAMESPACE``. One tenant per namespace then owns one prefix,
``/ddpjob/rdzv/<namespace>/``, so an etcd role can grant a tenant exactly its own
keys: the state is a pickle every agent loads, and whoever may write it runs code
in the job. ``run_id`` is the job's uid (``<uid>-<n>`` after a whole-group restart).

``generation`` is the etcd ``create_revision`` of the state key: every agent
of a run reads the same value, and a run that starts after the state key was
deleted (lease expiry, ``delete_rendezvous``) gets a new one, so it never reads
store keys (e.g. a stale MASTER_PORT) that an earlier run left behind.
"""
from __future__ import annotations

import os
from collections.abc import Mapping

from ddpjob_rdzv.contract import NAMESPACE_ENV

ROOT = "/ddpjob/rdzv"
# Prefix segment of runs outside a cluster (`ddpjob run`, a bare torchrun): a Kubernetes
# namespace is a DNS label, which never contains '_', so local runs never share a tenant's prefix.
LOCAL_NAMESPACE = "_local"


def _segment(what: str, value: str) -> str:
    if "/" in value:
        raise ValueError(f"{what} ({value!r}) must not contain '/': it names one etcd key prefix")
    return value


def validate_run_id(run_id: str) -> None:
    """Raises ValueError unless ``run_id`` can name a key prefix of its own."""
    if not run_id:
        raise ValueError("--rdzv_id must be a non-empty string (ddpjob uses the job's uid)")
    _segment("--rdzv_id", run_id)


def namespace_prefix(namespace: str) -> str:
    """The prefix of every run of ``namespace`` ("" means a local run); what a tenant's etcd role covers."""
    return f"{ROOT}/{_segment(NAMESPACE_ENV, namespace or LOCAL_NAMESPACE)}/"


def namespace_from_env(environ: Mapping[str, str] = os.environ) -> str:
    """The namespace the trainer runs in ("" outside a cluster, which namespace_prefix maps to LOCAL_NAMESPACE)."""
    return environ.get(NAMESPACE_ENV, "")


def run_prefix(namespace: str, run_id: str) -> str:
    """The prefix holding every key of ``run_id`` (ends with '/', so run 'a' never covers run 'ab')."""
    validate_run_id(run_id)
    return f"{namespace_prefix(namespace)}{run_id}/"


def state_key(namespace: str, run_id: str) -> str:
    return run_prefix(namespace, run_id) + "state"


def store_prefix(namespace: str, run_id: str, generation: int) -> str:
    return f"{run_prefix(namespace, run_id)}store/{generation}/"
