"""Names of the etcd keys of one rendezvous; every key of a run lives under ``run_prefix``.

    /ddpjob/rdzv/<run_id>/state                     torch's pickled rendezvous state (CAS on mod_revision)
    /ddpjob/rdzv/<run_id>/store/<generation>/<key>  the c10d store the agents share (MASTER_ADDR, ranks, ...)

``generation`` is the etcd ``create_revision`` of the state key: every agent
of a run reads the same value, and a run that starts after the state key was
deleted (lease expiry, ``delete_rendezvous``) gets a new one, so it never reads
store keys (e.g. a stale MASTER_PORT) that an earlier run left behind.
"""
from __future__ import annotations

ROOT = "/ddpjob/rdzv"


def validate_run_id(run_id: str) -> None:
    """Raises ValueError unless ``run_id`` can name a key prefix of its own."""
    if not run_id:
        raise ValueError("--rdzv_id must be a non-empty string (ddpjob uses the job's uid)")
    if "/" in run_id:
        raise ValueError(f"--rdzv_id ({run_id!r}) must not contain '/': it names one etcd key prefix")


def run_prefix(run_id: str) -> str:
    """The prefix holding every key of ``run_id`` (ends with '/', so run 'a' never covers run 'ab')."""
    validate_run_id(run_id)
    return f"{ROOT}/{run_id}/"


def state_key(run_id: str) -> str:
    return run_prefix(run_id) + "state"


def store_prefix(run_id: str, generation: int) -> str:
    return f"{run_prefix(run_id)}store/{generation}/"
