"""The terminal view of a local run: a live table on a TTY, plain timestamped lines otherwise.

`render` is a pure function of the RunState and the run clock; the two views
only decide how it reaches the terminal. The live view redraws the table in
place under the scrolling log; the plain view (CI logs, pipes) prints the log
lines and a progress line now and then, never control characters.
"""

from __future__ import annotations

import shutil
from typing import TextIO

from .state import BACKOFF, RUNNING, STARTING, RunState, fmt_number

PLAIN_PROGRESS_SECONDS = 10.0  # a progress line this often in plain output
COLUMNS = ("NODE", "STATE", "PID", "STARTS", "LAST EXIT")


def progress(state: RunState, now: float | None = None) -> str:
    """'mlp  Running  world size 2  epoch 1  step 87  loss 0.0973', or, for code that reports
    no steps, what the runner knows itself: 'tut  Started  nodes 2/2 up  41 s since start  ...'."""
    if state.step is None and now is not None and any(n.pid is not None for n in state.nodes.values()):
        return without_progress(state, now)
    return "  ".join([state.job, state.phase,
                      f"world size {state.world_size if state.world_size is not None else '-'}",
                      f"epoch {state.epoch if state.epoch is not None else '-'}",
                      f"step {state.step if state.step is not None else '-'}",
                      f"loss {fmt_number(state.loss)}"])


def without_progress(state: RunState, now: float) -> str:
    """The progress line of a run whose code reports no training step (see docs/byo.md)."""
    up = sum(1 for n in state.nodes.values() if n.state in (STARTING, RUNNING) and n.pid is not None)
    phase = "Started" if state.phase == "Pending" else state.phase
    return "  ".join([state.job, phase, f"nodes {up}/{len(state.nodes)} up", f"{now:.0f} s since start",
                      "no training progress reported (ddpjob_trainer.Job reports it)"])


def recovery(state: RunState) -> str:
    """'torchrun restarts 1  failure incidents 1/5  last snapshot step 80'."""
    parts = [f"torchrun restarts {state.torchrun_restarts}",
             f"failure incidents {state.incidents}/{state.max_incidents}"]
    if state.last_snapshot_step is not None:
        parts.append(f"last snapshot step {state.last_snapshot_step}")
    return "  ".join(parts)


def headline(state: RunState, now: float | None = None) -> str:
    """progress and recovery on one line (the plain view's progress line)."""
    return f"{progress(state, now)}  {recovery(state)}"


def _node_state(node, now: float) -> str:
    if node.state == BACKOFF and node.replace_at is not None:
        return f"backoff {max(0.0, node.replace_at - now):.0f}s"
    return node.state


def render(state: RunState, now: float) -> list[str]:
    """The table: a headline, one row per node, and the latest decision."""
    rows = [COLUMNS]
    for node in sorted(state.nodes.values(), key=lambda n: n.index):
        rows.append((str(node.index), _node_state(node, now), str(node.pid or "-"), str(node.starts),
                     "-" if node.last_exit is None else str(node.last_exit)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = [progress(state, now), recovery(state)]
    lines += ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    if state.message:
        lines.append(f"last decision: {state.message}")
    return lines


def stamp(now: float, line: str) -> str:
    """'[  12.3s] line': the run clock in front of a log line."""
    return f"[{now:7.1f}s] {line}"


class PlainView:
    """Log lines as they happen and a progress line every PLAIN_PROGRESS_SECONDS."""

    def __init__(self, out: TextIO):
        self.out = out
        self.next_progress = PLAIN_PROGRESS_SECONDS

    def log(self, now: float, line: str) -> None:
        print(stamp(now, line), file=self.out, flush=True)

    def refresh(self, state: RunState, now: float) -> None:
        if now >= self.next_progress:
            self.next_progress = now + PLAIN_PROGRESS_SECONDS
            self.log(now, headline(state, now))

    def close(self, state: RunState, now: float) -> None:
        for line in render(state, now):
            print(line, file=self.out)
        self.out.flush()


class LiveView:
    """The table redrawn in place below the scrolling log lines (ANSI cursor movement)."""

    def __init__(self, out: TextIO):
        self.out = out
        self.drawn = 0  # lines of the table currently on screen

    def _erase(self) -> None:
        if self.drawn:
            # Cursor to the start of the table's first line, then clear to the end of the screen.
            self.out.write(f"\x1b[{self.drawn}F\x1b[J")
            self.drawn = 0

    def log(self, now: float, line: str) -> None:
        self._erase()
        self.out.write(stamp(now, line) + "\n")
        self.out.flush()

    def refresh(self, state: RunState, now: float) -> None:
        self._erase()
        # A wrapped line would take two rows and break the erase count: cut to the width.
        width = max(20, shutil.get_terminal_size().columns - 1)
        lines = [line[:width] for line in render(state, now)]
        self.out.write("\n".join(lines) + "\n")
        self.drawn = len(lines)
        self.out.flush()

    def close(self, state: RunState, now: float) -> None:
        self.refresh(state, now)
        self.drawn = 0
