"""Giving up: a DoNotRetry fails the pod now instead of after torchrun's restarts.

The termination message gets a record with ``fatal`` (the operator then fails the whole job
with its reason), and the worker stops its torchrun agent so the container exits at once
(docs/hangs.md). :func:`do_not_retry` is the entry for a script outside the Trainer and Job.
"""
from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

from ddpjob_rdzv.contract import NODE_INDEX_ENV
from ddpjob_trainer import zygote
from ddpjob_trainer.errors import DoNotRetry
from ddpjob_trainer.report.record import ProgressReport, default_path

log = logging.getLogger(__name__)


def stop_agent(environ: dict[str, str] | os._Environ = os.environ) -> bool:
    """Stops this worker's torchrun agent (SIGTERM), so that the container exits now with the
    record's ``fatal`` instead of torchrun restarting the workers elasticPolicy.maxRestarts times
    first (each would raise DoNotRetry again). Only in a pod, where the operator reads the record
    from the termination message, and only when the parent process is torchrun. Returns whether
    it signalled."""
    if not environ.get("TORCHELASTIC_RUN_ID") or default_path(environ) is None:
        return False
    # A worker forked by the zygote has the fork server as its parent; its client names the agent.
    parent = int(environ.get(zygote.AGENT_PID_ENV) or os.getppid())
    try:
        command = Path(f"/proc/{parent}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return False
    if b"torchrun" not in command and b"torch.distributed.run" not in command:
        return False
    log.error("DoNotRetry: stopping the torchrun agent (pid %d) so the pod fails now", parent)
    os.kill(parent, signal.SIGTERM)
    return True


def give_up(error: DoNotRetry, *, written: bool = False, environ: dict[str, str] | os._Environ = os.environ) -> None:
    """Makes ``error`` fail the pod now: the termination message gets a record with ``fatal``
    (unless this worker's report ``written`` it already; a node's reporting rank rewrites the
    message with its full record and keeps ``fatal``), then the torchrun agent is stopped
    (stop_agent)."""
    if not written:
        ProgressReport(default_path(environ), None, node=environ.get(NODE_INDEX_ENV, "")).failed(error)
    stop_agent(environ)


def do_not_retry(message: str, reason: str = DoNotRetry.reason) -> None:
    """Fails the job for good with ``reason`` (an UpperCamelCase word) and ``message``, from any
    training script, inside ``Trainer.train`` or outside it.

    It raises DoNotRetry; outside the Trainer it first writes the record and stops the torchrun
    agent, as Trainer.train does for a DoNotRetry that escapes it. Torch-free, like the whole of
    report/, so a script may call it before importing anything heavy.

    Raises:
        DoNotRetry: always.
        ValueError: ``reason`` is not an UpperCamelCase word of at most 64 characters.
    """
    error = DoNotRetry(message, reason=reason)
    give_up(error)
    raise error
