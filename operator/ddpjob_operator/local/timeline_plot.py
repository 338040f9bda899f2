"""The timeline as a picture: a Timeline in, an SVG or PNG file out (matplotlib, the [plot] extra).

Two panels on the run clock: above, the training step of each trainer run with its snapshots,
below, the world size each run started with and the agents running. Kills, node failures and
group restarts are vertical lines labelled in words; the spans in phase Restarting are shaded
in both. Nothing is read but the Timeline, so the picture shows what timeline.json says.

Uses matplotlib's object API (Figure, no pyplot): no global state, no GUI backend, safe in a
process that is not the main thread. SVG text stays text (svg.fonttype none), so its labels
can be searched, and the file carries no date, so the same run draws the same file.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from .timeline import Mark, Timeline

STEP_COLOR, SNAPSHOT_COLOR, PAUSE_COLOR = "tab:blue", "tab:green", "0.85"
MARK_COLORS = {"kill": "tab:red", "failure": "tab:orange", "group": "tab:purple", "spare": "tab:green"}
MERGE_FRACTION = 0.015  # marks closer than this share of the run share one label
STYLE = {"svg.fonttype": "none", "svg.hashsalt": "ddpjob-timeline", "font.size": 9}


def draw(timeline: Timeline, path: Path) -> Path:
    """Draws `timeline` into `path` (its suffix picks the format: .svg, .png, .pdf); returns path."""
    with matplotlib.rc_context(STYLE):
        figure = Figure(figsize=(10, 5.5), layout="constrained")
        steps_axes, size_axes = figure.subplots(2, 1, sharex=True, height_ratios=(3, 1))
        _draw_steps(steps_axes, timeline)
        _draw_sizes(size_axes, timeline)
        for axes in (steps_axes, size_axes):
            _draw_pauses(axes, timeline)
        _draw_marks(steps_axes, size_axes, timeline)
        steps_axes.set_xlim(0, max(timeline.end, 1.0))
        steps_axes.legend(loc="upper left", fontsize="small")
        size_axes.legend(loc="upper left", fontsize="small")
        figure.suptitle(_title(timeline))
        metadata = {"Date": None} if path.suffix.lower() == ".svg" else None
        figure.savefig(path, metadata=metadata)
    return path


def _title(timeline: Timeline) -> str:
    resumes = max(0, len(timeline.runs) - 1)  # the summary's "resumed at" lines
    return (f"ddpjob run {timeline.job}: {timeline.phase or 'unfinished'} after {timeline.end:.0f} s; "
            f"{len(timeline.kills)} kill(s), {len(timeline.failures)} failure(s), {resumes} resume(s), "
            f"{len(timeline.snapshots)} snapshot(s)")


def _draw_steps(axes: Axes, timeline: Timeline) -> None:
    for index, run in enumerate(timeline.runs):  # one line per run: a resume starts a new one
        if run.steps:
            times, steps = zip(*run.steps)
            axes.plot(times, steps, color=STEP_COLOR, linewidth=1.2, label="training step" if index == 0 else None)
    if timeline.snapshots:
        times, steps = zip(*timeline.snapshots)
        axes.plot(times, steps, linestyle="none", marker="o", markersize=4, color=SNAPSHOT_COLOR, label="snapshot")
    axes.set_ylabel("step")
    axes.grid(alpha=0.3)


def _draw_sizes(axes: Axes, timeline: Timeline) -> None:
    sized = [(r.t, r.world_size) for r in timeline.runs if r.world_size is not None]
    if sized:
        times, sizes = zip(*sized)
        axes.plot(list(times) + [timeline.end], list(sizes) + [sizes[-1]], drawstyle="steps-post",
                  color=STEP_COLOR, label="world size")
    if timeline.nodes_running:
        times, counts = zip(*timeline.nodes_running)
        axes.plot(list(times) + [timeline.end], list(counts) + [counts[-1]], drawstyle="steps-post",
                  color="0.4", linestyle="--", label="nodes running")
    axes.set_ylabel("world size")
    axes.set_xlabel("run time (s)")
    axes.set_ylim(bottom=0)
    axes.grid(alpha=0.3)


def _draw_pauses(axes: Axes, timeline: Timeline) -> None:
    for index, (start, end) in enumerate(timeline.pauses):
        axes.axvspan(start, end, color=PAUSE_COLOR, zorder=0, label="restarting" if index == 0 else None)


def _draw_marks(steps_axes: Axes, size_axes: Axes, timeline: Timeline) -> None:
    marks = sorted([(m, MARK_COLORS["kill"]) for m in timeline.kills]
                   + [(m, MARK_COLORS["failure"]) for m in timeline.failures]
                   + [(m, MARK_COLORS["group"]) for m in timeline.group_restarts]
                   + [(m, MARK_COLORS["spare"]) for m in timeline.promotions], key=lambda pair: pair[0].t)
    for axes in (steps_axes, size_axes):
        for mark, color in marks:
            axes.axvline(mark.t, color=color, linestyle=":", linewidth=1.2)
    for t, label, color in _labels(marks, MERGE_FRACTION * max(timeline.end, 1.0)):
        # In axes coordinates vertically, so the label stands at the top whatever the step range.
        steps_axes.text(t, 0.98, f"{label} ", transform=steps_axes.get_xaxis_transform(), rotation=90,
                        va="top", ha="right", color=color, fontsize="small")


def _labels(marks: list[tuple[Mark, str]], within: float) -> list[tuple[float, str, str]]:
    """One label per cluster of marks closer than `within` seconds (a kill and the exit it
    causes come a tenth of a second apart): "kill node 1; node 1 exit 137", in the first's color."""
    labels: list[tuple[float, str, str]] = []
    for mark, color in marks:
        if labels and mark.t - labels[-1][0] < within:
            t, text, first = labels[-1]
            labels[-1] = (t, f"{text}; {mark.label}", first)
        else:
            labels.append((mark.t, mark.label, color))
    return labels
