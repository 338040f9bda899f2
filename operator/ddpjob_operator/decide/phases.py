"""What a job's phase means for the operator's own work (pure): the one place that says whether a
job is finished and whether its pods train.

Everything that depends on "is the job finished" (what a pass observes, the plan of a finished
job, when its rendezvous keys may go) asks here, so the answer cannot differ between the room
that decides and the room that executes.
"""

from __future__ import annotations

from typing import Any, Mapping

from ddpjob_operator.api import constants as C

# Phases whose pods train: their progress endpoints are read, and the pass comes back to read them again.
TRAINING_PHASES = (C.PHASE_RUNNING, C.PHASE_RESTARTING)


def phase_of(status: Mapping[str, Any] | None) -> str | None:
    """status.phase (None before the first pass wrote one)."""
    return (status or {}).get("phase")


def finished(status: Mapping[str, Any] | None) -> bool:
    """Succeeded or Failed: the phase never changes again."""
    return phase_of(status) in C.FINISHED_PHASES


def training(status: Mapping[str, Any] | None) -> bool:
    """Running or Restarting: the job's pods train, so their progress is worth reading."""
    return phase_of(status) in TRAINING_PHASES


def progress_poll_requeue(status: Mapping[str, Any] | None, progress_poll: float) -> float | None:
    """When to look again at a training job's progress without an event: every
    ``progress_poll`` seconds (--progress-poll-seconds; 0 turns polling off) while it trains."""
    return progress_poll if progress_poll and training(status) else None
