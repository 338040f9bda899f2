"""Exceptions a training script raises to tell the operator what a failure means.

Torch-free, so a script can import it before anything heavy. It sits below every room: the
report (report/) records a DoNotRetry and gives up on it; this module imports nothing of ours.
"""
from __future__ import annotations

from ddpjob_rdzv.contract import progress_record


class DoNotRetry(Exception):
    """Retrying cannot help: a bad dataset, an invalid configuration, a licence refused.

    When it (or a subclass) escapes ``Trainer.train`` on a node's local-rank-0 worker, the
    node's progress record carries ``fatal: {reason, message}`` and the operator fails the
    whole job at once with that reason, instead of replacing the node and spending the
    restart budget on a failure that would repeat::

        class BadDataset(DoNotRetry):
            reason = "BadDataset"

        raise BadDataset(f"{path}: checksum {got} != {expected}")
        raise DoNotRetry("no such tokenizer: gpt9", reason="MissingTokenizer")

    Raised out of ``Trainer.train`` on any rank, the record (in the pod's termination message)
    gets ``fatal`` and the worker stops its torchrun agent, so the pod fails at once instead of
    torchrun restarting the workers elasticPolicy.maxRestarts times first; the operator also
    fails the job as soon as it reads ``fatal`` from a running node's progress endpoint. A
    script with its own loop calls :func:`~ddpjob_trainer.report.give_up.do_not_retry` (docs/hangs.md).

    Args:
        message: what went wrong; its first progress_record.MAX_ERROR_CHARS characters are kept.
        reason: an UpperCamelCase word for the job's Failed condition and Event (default:
            the class's ``reason``, "DoNotRetry").

    Raises:
        ValueError: ``reason`` is not an UpperCamelCase word of at most 64 characters.
    """

    reason = "DoNotRetry"

    def __init__(self, message: str = "", *, reason: str | None = None):
        super().__init__(message)
        if reason is not None:
            self.reason = reason
        problem = progress_record.check_reason(self.reason)
        if problem is not None:
            raise ValueError(f"DoNotRetry: {problem.message}")

