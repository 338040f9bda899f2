"""Whether a pass writes the status it computed, or keeps it in the operator's memory (pure).

A training job's progress moves at every poll: written each time, 1,000 running jobs polled
every 30 s cost ~33 status PATCHes/s, more than the client's whole default budget (20/s),
so creates and replacements would queue behind progress. So a pass writes at once only what
someone acts on or reads as news: a phase, a condition, a failure (a hang's or a straggler's
included), a restart, a count, anything but the *routine* fields below. A change to routine
fields only (the step, its time, the hang clock, the slowest node's figures, a newer
snapshot) is written at most once per ``interval`` (--status-write-interval-seconds), and
meanwhile kept by the operator (controller/memory.py's StatusMemory) as the next pass's
previous status, so hang and straggler detection see every poll exactly as before.

The default interval, 600 s, is what the budget allows: 1,000 jobs x 1 write / 600 s =
1.7 writes/s, under 2/s, leaving 18/s of the default 20/s to the writes that matter. The
price: ``kubectl get``'s STEP column and status.lastSnapshot trail the job by at most one
interval plus one poll; an operator restart loses the kept status (see StatusMemory).
"""

from __future__ import annotations

from typing import Any, Mapping

DEFAULT_INTERVAL_SECONDS = 600.0  # --status-write-interval-seconds: see above

# status.progress fields that change at every poll of a job that trains (hang.py, straggler.py);
# ``run`` (torchrun restarted the workers) and ``reportedStraggler`` (a straggler was reported) are news.
ROUTINE_PROGRESS = frozenset({"step", "stepSeconds", "advancedTime", "hangTimeoutSeconds",
                              "slowestNode", "slowdown", "slowSince"})
ROUTINE_FIELDS = frozenset({"lastSnapshot"})  # a newer snapshot: progress.py


def routine_only(written: Mapping[str, Any] | None, computed: Mapping[str, Any]) -> bool:
    """True when ``computed`` differs from ``written`` (the stored status) in routine fields only."""
    written = written or {}
    for key in set(written) | set(computed):
        old, new = written.get(key), computed.get(key)
        if old == new or key in ROUTINE_FIELDS:
            continue
        if key != "progress" or not isinstance(new, Mapping) or not isinstance(old, Mapping):
            return False
        if any(old.get(k) != new.get(k) for k in set(old) | set(new) if k not in ROUTINE_PROGRESS):
            return False
    return True


def write_due(written: Mapping[str, Any] | None, computed: Mapping[str, Any], since_write: float,
              interval: float) -> bool:
    """Whether the pass writes ``computed`` over the stored ``written`` status now.

    Args:
        written: the status as stored (what ``kubectl get`` shows).
        computed: the status this pass computed.
        since_write: seconds since this job's status was last written, or since the operator
            first saw the job when it has written none (a restarted operator does not flush
            every job at once).
        interval: --status-write-interval-seconds; 0 writes every change at once.
    """
    if computed == (written or {}):
        return False
    return interval <= 0 or since_write >= interval or not routine_only(written, computed)
