"""Checks shared by the elastic tests: what the metrics file must prove after faults.

The trainer's ``read_metrics`` and the harness's independent
``effective_history`` must agree, and both must show every global step and
every epoch exactly once; ``start`` events must resume from the newest
complete snapshot, never from scratch once one exists, or from a newer step the
job had trained (the fast snapshot tier's copy, on by default), never past it.
"""
from __future__ import annotations

from pathlib import Path

from ddpjob_trainer.report.metrics import read_metrics
from ddpjob_sandbox.metrics import effective_history, read_events


def assert_ran_exactly_once(metrics_path: Path, epochs: int) -> list[dict]:
    """Asserts the job's effective history: steps 1..N once each, epochs once each, one done.

    Returns the raw events for further checks.
    """
    raw = read_events(metrics_path)
    effective = read_metrics(metrics_path)
    steps = [event["step"] for event in effective if event["event"] == "step"]
    independent = [event["step"] for event in effective_history(raw, kinds=("step",))]
    assert steps == independent, f"read_metrics steps {steps} differ from the independent rollback {independent}"
    assert steps == list(range(1, len(steps) + 1)), f"effective steps are not 1..N each once: {steps}"

    epoch_ends = [event["epoch"] for event in effective if event["event"] == "epoch_end"]
    assert epoch_ends == list(range(epochs)), f"effective epoch_end events {epoch_ends} must be epochs 0..{epochs - 1} once each"
    done = [event for event in effective if event["event"] == "done"]
    assert len(done) == 1 and done[0]["step"] == steps[-1], f"expected one done event at step {steps[-1]}: {done}"
    # A restart after the final snapshot (a worker crashing on its way out) may
    # report done again; a done before the last step means an attempt was undone.
    early = [event for event in raw if event["event"] == "done" and event["step"] != steps[-1]]
    assert not early, f"an attempt reported done before the final step {steps[-1]} and was rolled back: {early}"
    return raw


def assert_resumed_from_snapshots(raw: list[dict]) -> list[dict]:
    """Every restart resumes at the newest snapshot recorded before it, or at a newer step trained
    before it (a fast snapshot tier copy: the volume does not record those), and trains on from
    the next step; returns the restart ``start`` events."""
    last_snapshot = None
    trained = 0  # the newest step any attempt trained so far
    starts = []
    for index, event in enumerate(raw):
        if event["event"] == "snapshot":
            last_snapshot = event
        elif event["event"] == "step":
            trained = max(trained, event["step"])
        elif event["event"] == "start":
            expected = last_snapshot["step"] if last_snapshot else 0
            assert expected <= event["resume_step"] <= max(trained, expected), (
                f"start event {event} must resume at step {expected}, the newest snapshot before it, "
                f"or at a newer step trained before it (at most {trained})"
            )
            resumed = event["resume_step"]
            first_step = next((e for e in raw[index + 1:] if e["event"] in ("step", "start")), None)
            if first_step is not None and first_step["event"] == "step":
                assert first_step["step"] == resumed + 1, (
                    f"first step after {event} is {first_step['step']}, expected {resumed + 1}"
                )
            starts.append(event)
    return starts[1:]


def world_size_phases(raw: list[dict]) -> list[int]:
    """World sizes of the raw step events with consecutive repeats collapsed: [2, 3, 2]."""
    phases: list[int] = []
    for event in raw:
        if event["event"] == "step" and (not phases or phases[-1] != event["world_size"]):
            phases.append(event["world_size"])
    return phases


def steps_redone(raw: list[dict]) -> list[int]:
    """Global steps that appear more than once in the raw file (work lost to a fault and redone)."""
    seen: set[int] = set()
    redone = []
    for event in raw:
        if event["event"] == "step":
            if event["step"] in seen:
                redone.append(event["step"])
            seen.add(event["step"])
    return redone
