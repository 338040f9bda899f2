"""The end-of-run summary: what the trainer's metrics prove about the run.

The rollback rule (a `start` that resumes from step S discards the logged work
past S) has one definition, `ddpjob_trainer.report.metrics.read_metrics`; this module
only counts what it returns. "No step ran twice" means: in that effective
history the steps are exactly 1..N, each once, and one `done` closes it. Steps
that were trained after the last snapshot and lost with a dead node show up
in the raw file twice; they are reported as redone work, not hidden.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Summary:
    """The proof and the figures behind it."""

    lines: list[str]
    exact: bool  # effective steps are 1..N, each once, and training is done
    resumes: int  # trainer starts after the first


def summarize(metrics_file: Path) -> Summary:
    """Reads `metrics_file` and states what it proves (empty when there is none)."""
    if not metrics_file.exists():
        return Summary([f"no metrics at {metrics_file}: the job wrote none, nothing to prove"], False, 0)
    # Imported here: the operator package must not need the trainer (or torch) to load.
    from ddpjob_trainer.report.metrics import read_metrics, read_raw_metrics

    raw, effective = read_raw_metrics(metrics_file), read_metrics(metrics_file)
    starts = [e for e in raw if e.get("event") == "start"]
    steps = [e["step"] for e in effective if e.get("event") == "step"]
    losses = [e["loss"] for e in effective if e.get("event") == "epoch_end"]
    done = [e for e in effective if e.get("event") == "done"]
    redone = sum(1 for e in raw if e.get("event") == "step") - len(steps)
    once = bool(steps) and steps == list(range(1, len(steps) + 1))
    exact = once and len(done) == 1
    lines = [f"summary of {metrics_file}:"]
    for start in starts[1:]:
        lines.append(f"  resumed at epoch {start.get('resume_epoch')}, step {start.get('resume_step')} "
                     f"(world size {start.get('world_size')})")
    lines.append(f"  epochs finished: {len(losses)}; loss per epoch: " + ", ".join(f"{x:.4f}" for x in losses))
    lines.append(f"  steps 1..{len(steps)}, each trained exactly once in the effective history: "
                 + ("yes" if once else "NO"))
    if len(done) != 1:
        lines.append("  training did not finish (no done event)")
    if redone:
        lines.append(f"  {redone} step(s) ran after the last snapshot, were lost with the failed node's "
                     "group and were trained again (counted once above)")
    return Summary(lines, exact, max(0, len(starts) - 1))
