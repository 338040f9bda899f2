"""Trainer benchmark: recovery time, snapshot overhead and loop overhead, side by side.

Run with ``python -m bench trainer``. In one run on the same machine:

(a) recovery: two torchrun agents on loopback (c10d, the test's fast
    rendezvous settings); one worker is SIGKILLed after the first snapshot.
    Measured from the kill to the first training step of the restarted
    group, for ddpjob's example and for a bare tutorial-style script
    (``bench/_baselines/tutorial.py``), plus the steps each had to redo.
(b) snapshot overhead: training throughput of ddpjob's Trainer with a
    snapshot every epoch (sync, async) over throughput with none.
(c) loop overhead: ddpjob's Trainer without snapshots over a hand-written
    DDP loop (``bench/_baselines/handwritten.py``), same model and data.
(d) fast snapshot tier: the Trainer copying its whole state (a ~9 M-parameter
    MLP + Adam: >= 100 MB) to /dev/shm after every step (the default), over the
    same job with the tier off; no step sleep. The copy runs in a thread beside
    training, so wall clock is the figure that counts (target: the median step
    at most 3 % slower); the training thread's CPU time per step stands beside
    it as the steadier measure (what the copy costs the training thread: the
    wait for it, the state's flattening, memory bandwidth), and the process's
    CPU time (the copy thread's work included) beside that.

``BENCH_TRAINER_PARTS`` picks parts (e.g. ``cd``; default ``abcd``), ``BENCH_TRAINER_REPEATS``
the rounds (default 6).

(b), (c) and (d) run in this process as a one-rank gloo group with one torch
thread. With one rank the trainer skips its per-step loss all-reduce (there
is nothing to reduce); with more it overlaps it with the optimizer step.
Throughput is samples over a whole ``train()`` call, per second of the
training thread's CPU time (less disturbed than wall time by other processes,
yet on this VM not immune) and per wall-clock second. The configurations run
in ``REPEATS`` rounds, in a balanced order (``round_order``), each after a
garbage collection; ratios are taken within a round (neighbouring runs share
the machine's load) and their median is reported with the range, so a ratio
inside the range of its noise reads as a tie. The blocking time of one save
is timed directly: it is the most stable figure for (b); for (c) the median
single-step time is the most stable one, since preemptions hit few steps. It
is taken the same way in both loops, from one optimizer step's end to the
next by a hook on the optimizer (``step_clock``), so it includes the
trainer's per-step metrics line and heartbeat; its CPU time stands beside it.
"""
from __future__ import annotations

import contextlib
import datetime
import gc
import logging
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from bench._baselines import handwritten
from ddpjob_sandbox.procs import free_port
from ddpjob_sandbox.torchrun import AgentGroup, Rendezvous
from ddpjob_sandbox.metrics import MetricsWatcher, is_event, read_events

REPEATS = int(os.environ.get("BENCH_TRAINER_REPEATS", "6"))  # rounds of (b), (c), (d)
RECOVERY_REPEATS = 4
TARGETS = {"recovery": 1.2, "async_overhead": 0.02, "loop": 0.99, "fast_tier": 0.97}

# Throughput model: ~2.4 M parameters (snapshot with Adam state ~29 MB), so
# a snapshot is a visible cost next to an epoch of a few seconds on a CPU.
FEATURES, HIDDEN, DEPTH, OUTPUTS = 256, 1024, 3, 16
SAMPLES, BATCH, EPOCHS = 12288, 128, 2

# (d): 256-2048x3-16 = 8.9 M parameters, 107 MB with Adam's two moments (float32).
FAST_HIDDEN, FAST_SAMPLES, FAST_BATCH = 2048, 64 * 48, 64

# Recovery job: short epochs so the first snapshot comes quickly; the
# step sleep keeps training running while the fault is injected.
RECOVERY_ARGS = ["--epochs", "50", "--samples", "512", "--batch-size", "32", "--step-sleep", "0.05"]
TUTORIAL = Path(__file__).parent / "_baselines" / "tutorial.py"
EVENT_TIMEOUT = 120


# -- (a) recovery -------------------------------------------------------------------


@dataclass
class Recovery:
    """One kill: seconds to the restart's ``start`` event and to its first step; steps redone."""

    to_start: float
    to_first_step: float
    steps_redone: int


def event_time(event: dict) -> float:
    """The event's wall time in seconds since the epoch (ISO-8601 string in the metrics)."""
    return datetime.datetime.fromisoformat(event["time"].replace("Z", "+00:00")).timestamp()


def measure_recovery(target: list[str], workdir: Path) -> Recovery:
    """Starts two agents, kills one worker after the first snapshot, times the restart."""
    metrics = workdir / "metrics.jsonl"
    with AgentGroup(workdir, Rendezvous.c10d(nnodes="1:2"), target) as group:
        group.start(rdzv_conf_extra={"is_host": True})
        victim = group.start(rdzv_conf_extra={"is_host": False})
        watcher = MetricsWatcher(metrics, group)
        watcher.wait(is_event("snapshot", step=lambda s: s > 0), EVENT_TIMEOUT, "the first snapshot")
        watcher.wait(is_event("step"), EVENT_TIMEOUT, "a step after the first snapshot")
        victim.wait_for_workers()
        killed_at = time.time()
        victim.kill_worker()
        start = watcher.wait(lambda e: e["event"] == "start" and event_time(e) > killed_at, EVENT_TIMEOUT, "restart")
        first = watcher.wait(is_event("step"), EVENT_TIMEOUT, "the first resumed step")
    done_before = max(e["step"] for e in read_events(metrics) if e["event"] == "step" and event_time(e) <= killed_at)
    return Recovery(event_time(start) - killed_at, event_time(first) - killed_at, done_before - start["resume_step"])


def recovery_runs() -> dict[str, list[Recovery]]:
    """Alternates ddpjob's example and the tutorial script under the same torchrun settings."""
    runs: dict[str, list[Recovery]] = {"ddpjob": [], "tutorial": []}
    for _ in range(RECOVERY_REPEATS):
        for name in runs:
            with tempfile.TemporaryDirectory(prefix=f"bench-recovery-{name}-") as tmp:
                workdir = Path(tmp)
                common = [*RECOVERY_ARGS, "--snapshot-dir", str(workdir), "--metrics-file", str(workdir / "metrics.jsonl")]
                if name == "ddpjob":
                    target = ["-m", "ddpjob_trainer.examples.mlp", *common, "--val-samples", "0", "--no-progress-bar"]
                else:
                    target = [str(TUTORIAL), *common]
                runs[name].append(measure_recovery(target, workdir))
    return runs


# -- (b) and (c) throughput ---------------------------------------------------------


def make_model(seed: int = 0, hidden: int = HIDDEN) -> torch.nn.Module:
    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = [torch.nn.Linear(FEATURES, hidden), torch.nn.ReLU()]
    for _ in range(DEPTH - 1):
        layers += [torch.nn.Linear(hidden, hidden), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(hidden, OUTPUTS))


def make_dataset(seed: int = 0, samples: int = SAMPLES) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(samples, FEATURES, generator=generator)
    return TensorDataset(inputs, inputs @ torch.randn(FEATURES, OUTPUTS, generator=generator))


def mse(model: torch.nn.Module, batch) -> torch.Tensor:
    inputs, targets = batch
    return F.mse_loss(model(inputs), targets)


@dataclass
class Throughput:
    """Samples per second of one run: wall clock, training thread's CPU time, and of its median
    single step in wall-clock and CPU time; the process's CPU time beside them."""

    wall: float
    cpu: float
    step: float = 0.0
    step_cpu: float = 0.0
    process_cpu: float = 0.0  # samples per second of the whole process's CPU time (every thread)


def step_clock(optimizer: torch.optim.Optimizer) -> list[tuple[float, float]]:
    """Each optimizer step's end (wall clock, training thread's CPU time), noted by a hook on the
    optimizer: the same mark in both loops, so a step is one whole turn of either loop."""
    ends: list[tuple[float, float]] = []
    optimizer.register_step_post_hook(lambda *_: ends.append((time.perf_counter(), time.thread_time())))
    return ends


def set_step_figures(result: Throughput, ends: list[tuple[float, float]], batch: int = BATCH) -> Throughput:
    """Fills in the median single step's samples/s, wall clock and CPU time, from step_clock's marks."""
    result.step, result.step_cpu = (batch / statistics.median(b[i] - a[i] for a, b in zip(ends, ends[1:]))
                                    for i in (0, 1))
    return result


@contextlib.contextmanager
def timed(result: list[Throughput], samples: int = SAMPLES * EPOCHS) -> Iterator[None]:
    """Times the block; appends its Throughput for ``samples`` samples."""
    wall, cpu, process = time.perf_counter(), time.thread_time(), time.process_time()
    yield
    result.append(Throughput(samples / (time.perf_counter() - wall), samples / (time.thread_time() - cpu),
                             process_cpu=samples / (time.process_time() - process)))


def ddpjob_throughput(env, workdir: Path, snapshots: str) -> Throughput:
    """ddpjob's Trainer with ``snapshots`` = none | sync | async (after every epoch)."""
    from ddpjob_trainer import Trainer, TrainerConfig

    model = make_model()
    config = TrainerConfig(
        epochs=EPOCHS,
        batch_size=BATCH,
        snapshot_dir=str(workdir / "snapshots") if snapshots != "none" else None,
        snapshot_every_epochs=1,
        async_snapshot=snapshots == "async",
        fast_snapshot_every_steps=0,  # the volume snapshot's cost alone: (d) measures the fast tier's
        metrics_file=str(workdir / "metrics.jsonl"),
        progress_bar=False,
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    ends = step_clock(optimizer)
    result: list[Throughput] = []
    with timed(result):
        Trainer(model, optimizer, make_dataset(), config, loss_fn=mse, env=env).train()
    # Not the trainer's own samples_per_s: that leaves out its metrics line and heartbeat.
    return set_step_figures(result[0], ends)


def handwritten_throughput() -> Throughput:
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    ends = step_clock(optimizer)
    result: list[Throughput] = []
    with timed(result):
        handwritten.train(model, optimizer, make_dataset(), mse, epochs=EPOCHS, batch_size=BATCH)
    return set_step_figures(result[0], ends)


@contextlib.contextmanager
def one_rank_group() -> Iterator[object]:
    """A one-rank gloo process group in this process, with torchrun's variables set and restored."""
    from ddpjob_trainer import distributed

    variables = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0", "WORLD_SIZE": "1",
                 "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        with distributed() as env:
            yield env
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def round_order(names: list[str], round_: int) -> list[str]:
    """The configurations' order in round ``round_``: a balanced Latin square (Williams design).

    Over ``len(names)`` rounds (an even number) each configuration runs once in each position and
    follows each other one once, so neither the first run of a round nor a given neighbour
    favours one configuration (a shuffle per round ran the trainer first in 4 of 6 rounds).
    """
    n = len(names)
    offsets = [0] + [(j + 1) // 2 if j % 2 else n - j // 2 for j in range(1, n)]
    return [names[(round_ + offset) % n] for offset in offsets]


def clean_slate() -> None:
    """Runs a full garbage collection now, outside the timing. The process holds ~180k objects
    (torch), so one full collection takes ~0.1 s, 2-3 % of a run: the cyclic collector's own
    full pass, if it fell inside one configuration's run, would tip that round's ratio."""
    gc.collect()


def throughput_runs(names: tuple[str, ...] = ("none", "sync", "async", "handwritten")) -> dict[str, list[Throughput]]:
    """Every run's samples/s per configuration, the configurations interleaved."""
    runs: dict[str, list[Throughput]] = {name: [] for name in names}
    # The runs without a snapshot directory would warn each time that a restart starts over.
    logging.getLogger("ddpjob_trainer").setLevel(logging.ERROR)
    # One intra-op thread: the compute then runs in the training thread, whose
    # CPU time is the load-independent figure, and OpenMP threads do not stall
    # when other processes oversubscribe the cores.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with one_rank_group() as env:
        with tempfile.TemporaryDirectory(prefix="bench-trainer-warmup-") as tmp:
            ddpjob_throughput(env, Path(tmp), "sync")  # warms allocator, page cache and imports
        for round_ in range(REPEATS):
            for name in round_order(list(runs), round_):
                clean_slate()
                with tempfile.TemporaryDirectory(prefix=f"bench-trainer-{name}-") as tmp:
                    if name == "handwritten":
                        value = handwritten_throughput()
                    else:
                        value = ddpjob_throughput(env, Path(tmp), name)
                runs[name].append(value)
    torch.set_num_threads(threads)
    return runs


def fast_tier_throughput(env, workdir: Path, every: int) -> Throughput:
    """The Trainer on the >= 100 MB model, one epoch, fast tier every ``every`` steps (0 = off)."""
    from ddpjob_trainer import Trainer, TrainerConfig

    model = make_model(hidden=FAST_HIDDEN)
    config = TrainerConfig(epochs=1, batch_size=FAST_BATCH, snapshot_dir=str(workdir / "snapshots"),
                           snapshot_every_epochs=0, fast_snapshot_every_steps=every, progress_bar=False)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    ends = step_clock(optimizer)
    result: list[Throughput] = []
    with timed(result, FAST_SAMPLES):
        Trainer(model, optimizer, make_dataset(samples=FAST_SAMPLES), config, loss_fn=mse, env=env).train()
    return set_step_figures(result[0], ends, FAST_BATCH)


def fast_tier_runs() -> dict[str, list[Throughput]]:
    """Fast tier off and every step, interleaved in balanced rounds."""
    runs: dict[str, list[Throughput]] = {"off": [], "every step": []}
    logging.getLogger("ddpjob_trainer").setLevel(logging.ERROR)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with one_rank_group() as env:
        with tempfile.TemporaryDirectory(prefix="bench-fast-warmup-") as tmp:
            fast_tier_throughput(env, Path(tmp), 1)
        for round_ in range(REPEATS):
            for name in round_order(list(runs), round_):
                clean_slate()
                with tempfile.TemporaryDirectory(prefix="bench-fast-") as tmp:
                    runs[name].append(fast_tier_throughput(env, Path(tmp), 1 if name == "every step" else 0))
    torch.set_num_threads(threads)
    return runs


def fast_tier_rows(runs: dict[str, list[Throughput]]) -> list[tuple[str, str, str]]:
    """The copy's cost as a fraction of the step: wall clock (the target) and the training thread's
    CPU time per median step side by side, then the whole run's wall clock and the process's CPU."""
    def ms(name: str, field: str) -> str:
        return f"{statistics.median(FAST_BATCH / getattr(r, field) for r in runs[name]) * 1000:.1f} ms"

    step = paired(runs, "every step", "off", "step")
    ok = 1 - statistics.median(step) <= 1 - TARGETS["fast_tier"]
    return [
        ("(d) fast tier cost, median step wall", ratio_cell(step, overhead=True),
         f"{ms('off', 'step')} off, {ms('every step', 'step')} every step; "
         f"target <= {1 - TARGETS['fast_tier']:.0%}: {_verdict(ok)}"),
        ("(d) fast tier cost, median step cpu", ratio_cell(paired(runs, "every step", "off", "step_cpu"), overhead=True),
         f"training thread: {ms('off', 'step_cpu')} off, {ms('every step', 'step_cpu')} every step"),
        ("(d) fast tier cost, whole run", ratio_cell(paired(runs, "every step", "off", "wall"), overhead=True),
         f"wall (slot allocation included); training thread cpu "
         f"{ratio_cell(paired(runs, 'every step', 'off', 'cpu'), overhead=True)}; process cpu (copy thread "
         f"included) {ratio_cell(paired(runs, 'every step', 'off', 'process_cpu'), overhead=True)}"),
    ]


def snapshot_blocking_seconds(async_save: bool, saves: int = 5) -> float:
    """Median seconds one ``SnapshotStore.save`` blocks the training thread (model + Adam state)."""
    from ddpjob_trainer import SnapshotStore

    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    mse(model, make_dataset()[:BATCH]).backward()
    optimizer.step()
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    blocked = []
    with tempfile.TemporaryDirectory(prefix="bench-snapshot-") as tmp:
        store = SnapshotStore(tmp, async_save=async_save)
        for index in range(saves):
            began = time.perf_counter()
            store.save(state, epoch=index, step=index + 1)
            blocked.append(time.perf_counter() - began)
            store.wait()  # outside the timing: the next save would wait for this one
    return statistics.median(blocked)


def snapshot_megabytes(hidden: int = HIDDEN) -> float:
    model = make_model(hidden=hidden)
    parameters = sum(p.numel() for p in model.parameters())
    return parameters * 4 * 3 / 1e6  # weights + Adam's two moments, float32


# -- report -------------------------------------------------------------------------


def _verdict(ok: bool) -> str:
    return "ok" if ok else "MISSED"


def recovery_rows(recovery: dict[str, list[Recovery]]) -> list[tuple[str, str, str]]:
    rows = []
    median = {name: statistics.median(r.to_first_step for r in runs) for name, runs in recovery.items()}
    for name, runs in recovery.items():
        starts = ", ".join(f"{r.to_start:.1f}" for r in runs)
        firsts = ", ".join(f"{r.to_first_step:.1f}" for r in runs)
        redone = ", ".join(str(r.steps_redone) for r in runs)
        rows.append((f"(a) recovery {name}", f"{median[name]:.1f} s",
                     f"kill->start {starts} s; kill->first step {firsts} s; steps redone {redone}"))
    ratio = median["ddpjob"] / median["tutorial"]
    rows.append(("(a) recovery ddpjob / tutorial", f"{ratio:.2f}x",
                 f"target <= {TARGETS['recovery']}x: {_verdict(ratio <= TARGETS['recovery'])}"))
    return rows


def paired(runs: dict[str, list[Throughput]], name: str, base: str, field: str) -> list[float]:
    """Per round, ``name``'s samples/s over ``base``'s: neighbouring runs share the machine's load."""
    return sorted(getattr(a, field) / getattr(b, field) for a, b in zip(runs[name], runs[base]))


def ratio_cell(ratios: list[float], overhead: bool) -> str:
    """Median of the paired ratios, as an overhead (1 - r) or a ratio, with the range in brackets."""
    if overhead:
        return f"{1 - statistics.median(ratios):+.1%} [{1 - ratios[-1]:+.1%} .. {1 - ratios[0]:+.1%}]"
    return f"{statistics.median(ratios):.3f}x [{ratios[0]:.3f} .. {ratios[-1]:.3f}]"


def throughput_rows(runs: dict[str, list[Throughput]]) -> list[tuple[str, str, str]]:
    median = {name: Throughput(*(statistics.median(getattr(r, f) for r in values) for f in ("wall", "cpu", "step", "step_cpu")))
              for name, values in runs.items()}
    rows = []
    epoch_seconds = SAMPLES / median["none"].wall
    if "sync" not in runs:  # part (c) alone
        return loop_rows(runs, median)
    for name, async_save in (("sync", False), ("async", True)):
        blocked = snapshot_blocking_seconds(async_save)
        rows.append((f"(b) one {name} save blocks training", f"{blocked * 1000:.0f} ms",
                     f"= {blocked / epoch_seconds:.1%} of a {epoch_seconds:.1f} s epoch"))
    for name in ("none", "sync", "async", "handwritten"):
        label = "(c) hand-written DDP loop" if name == "handwritten" else f"(b) ddpjob snapshots {name}"
        rows.append((label, f"{median[name].cpu:.0f} samples/s", f"wall {median[name].wall:.0f} samples/s"))
    for name in ("sync", "async"):
        cpu = paired(runs, name, "none", "cpu")
        note = f"wall {ratio_cell(paired(runs, name, 'none', 'wall'), overhead=True)}"
        if name == "async":
            ok = 1 - statistics.median(cpu) <= TARGETS["async_overhead"]
            note += f"; target <= {TARGETS['async_overhead']:.0%}: {_verdict(ok)}"
        rows.append((f"(b) overhead {name}", ratio_cell(cpu, overhead=True), note))
    return rows + loop_rows(runs, median)


def loop_rows(runs: dict[str, list[Throughput]], median: dict[str, Throughput]) -> list[tuple[str, str, str]]:
    rows = []
    cpu = paired(runs, "none", "handwritten", "cpu")
    rows.append(("(c) ddpjob / hand-written, whole run", ratio_cell(cpu, overhead=False),
                 f"wall {ratio_cell(paired(runs, 'none', 'handwritten', 'wall'), overhead=False)}"))
    step = paired(runs, "none", "handwritten", "step")
    ok = statistics.median(step) >= TARGETS["loop"]
    rows.append(("(c) ddpjob / hand-written, median step", ratio_cell(step, overhead=False),
                 f"{median['none'].step:.0f} vs {median['handwritten'].step:.0f} samples/s per step; "
                 f"cpu {ratio_cell(paired(runs, 'none', 'handwritten', 'step_cpu'), overhead=False)}; "
                 f"target >= {TARGETS['loop']}x: {_verdict(ok)}"))
    return rows


def main() -> None:
    began = time.monotonic()
    parts = os.environ.get("BENCH_TRAINER_PARTS", "abcd")
    rows = recovery_rows(recovery_runs()) if "a" in parts else []
    if "b" in parts:
        rows += throughput_rows(throughput_runs())
    elif "c" in parts:
        rows += throughput_rows(throughput_runs(("none", "handwritten")))
    if "d" in parts:
        rows += fast_tier_rows(fast_tier_runs())
    width = max(len(row[0]) for row in rows)
    print(f"(a) 2 torchrun agents, c10d, fast rdzv conf, SIGKILL one worker after the first snapshot; "
          f"median of {RECOVERY_REPEATS}")
    print(f"(b)(c) {FEATURES}-{HIDDEN}x{DEPTH}-{OUTPUTS} MLP + Adam (snapshot ~{snapshot_megabytes():.0f} MB), "
          f"{SAMPLES} samples x {EPOCHS} epochs, batch {BATCH}, 1 rank gloo, 1 torch thread; {REPEATS} rounds; "
          f"samples/s per second of training-thread CPU, wall clock beside it; "
          f"medians, ratios paired per round [min .. max]")
    print(f"(d) {FEATURES}-{FAST_HIDDEN}x{DEPTH}-{OUTPUTS} MLP + Adam (state ~{snapshot_megabytes(FAST_HIDDEN):.0f} MB), "
          f"{FAST_SAMPLES} samples, batch {FAST_BATCH}, no step sleep, fast tier in /dev/shm; {REPEATS} rounds")
    for label, value, note in rows:
        print(f"{label:<{width}}  {value:>18}  {note}")
    print(f"(bench took {time.monotonic() - began:.0f} s; load average {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
