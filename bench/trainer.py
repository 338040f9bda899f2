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

(b) and (c) run in this process as a one-rank gloo group, so they hide the
cost of the trainer's per-step loss all-reduce across ranks. Throughput is
measured between the first and the last optimizer step (start-up excluded),
best of ``REPEATS`` interleaved runs to damp noise from other processes.
"""
from __future__ import annotations

import contextlib
import datetime
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
from tests.support.procs import free_port
from tests.support.torchrun import AgentGroup, MetricsWatcher, Rendezvous, is_event, read_events

REPEATS = 8
RECOVERY_REPEATS = 8
TARGETS = {"recovery": 1.2, "async_overhead": 0.02, "loop": 0.99}

# Throughput model: ~2.4 M parameters (snapshot with Adam state ~29 MB), so
# a snapshot is a visible cost next to an epoch of a few seconds on a CPU.
FEATURES, HIDDEN, DEPTH, OUTPUTS = 256, 1024, 3, 16
SAMPLES, BATCH, EPOCHS = 6144, 128, 2

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


def make_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = [torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU()]
    for _ in range(DEPTH - 1):
        layers += [torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(HIDDEN, OUTPUTS))


def make_dataset(seed: int = 0) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(SAMPLES, FEATURES, generator=generator)
    return TensorDataset(inputs, inputs @ torch.randn(FEATURES, OUTPUTS, generator=generator))


def mse(model: torch.nn.Module, batch) -> torch.Tensor:
    inputs, targets = batch
    return F.mse_loss(model(inputs), targets)


@dataclass
class Throughput:
    """Samples per second of one run, by wall clock and by the training thread's CPU time."""

    wall: float
    cpu: float


@contextlib.contextmanager
def timed(result: list[Throughput]) -> Iterator[None]:
    """Times the block; appends its Throughput for SAMPLES x EPOCHS samples."""
    wall, cpu = time.perf_counter(), time.thread_time()
    yield
    samples = SAMPLES * EPOCHS
    result.append(Throughput(samples / (time.perf_counter() - wall), samples / (time.thread_time() - cpu)))


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
        metrics_file=str(workdir / "metrics.jsonl"),
        progress_bar=False,
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    result: list[Throughput] = []
    with timed(result):
        Trainer(model, optimizer, make_dataset(), config, loss_fn=mse, env=env).train()
    return result[0]


def handwritten_throughput() -> Throughput:
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    result: list[Throughput] = []
    with timed(result):
        handwritten.train(model, optimizer, make_dataset(), mse, epochs=EPOCHS, batch_size=BATCH)
    return result[0]


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


def throughput_runs() -> dict[str, Throughput]:
    """Best samples/s (wall and CPU separately) per configuration over interleaved repeats."""
    best = {name: Throughput(0.0, 0.0) for name in ("none", "sync", "async", "handwritten")}
    # One intra-op thread: the compute then runs in the training thread, whose
    # CPU time is the load-independent figure, and OpenMP threads do not stall
    # when other processes oversubscribe the cores.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with one_rank_group() as env:
        with tempfile.TemporaryDirectory(prefix="bench-trainer-warmup-") as tmp:
            ddpjob_throughput(env, Path(tmp), "sync")  # warms allocator, page cache and imports
        for _ in range(REPEATS):
            for name in best:
                with tempfile.TemporaryDirectory(prefix=f"bench-trainer-{name}-") as tmp:
                    if name == "handwritten":
                        value = handwritten_throughput()
                    else:
                        value = ddpjob_throughput(env, Path(tmp), name)
                best[name] = Throughput(max(best[name].wall, value.wall), max(best[name].cpu, value.cpu))
    torch.set_num_threads(threads)
    return best


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


def snapshot_megabytes() -> float:
    model = make_model()
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


def throughput_rows(best: dict[str, Throughput]) -> list[tuple[str, str, str]]:
    rows = []
    epoch_seconds = SAMPLES / best["none"].wall
    for name, async_save in (("sync", False), ("async", True)):
        blocked = snapshot_blocking_seconds(async_save)
        rows.append((f"(b) one {name} save blocks training", f"{blocked * 1000:.0f} ms",
                     f"= {blocked / epoch_seconds:.1%} of a {epoch_seconds:.1f} s epoch"))
    for name in ("none", "sync", "async"):
        rows.append((f"(b) ddpjob snapshots {name}", f"{best[name].cpu:.0f} samples/s", f"wall {best[name].wall:.0f} samples/s"))
    for name in ("sync", "async"):
        cpu, wall = 1 - best[name].cpu / best["none"].cpu, 1 - best[name].wall / best["none"].wall
        note = f"wall {wall:+.1%}"
        if name == "async":
            note += f"; target <= {TARGETS['async_overhead']:.0%}: {_verdict(cpu <= TARGETS['async_overhead'])}"
        rows.append((f"(b) overhead {name}", f"{cpu:+.1%}", note))
    hand = best["handwritten"]
    rows.append(("(c) hand-written DDP loop", f"{hand.cpu:.0f} samples/s", f"wall {hand.wall:.0f} samples/s"))
    cpu, wall = best["none"].cpu / hand.cpu, best["none"].wall / hand.wall
    rows.append(("(c) ddpjob / hand-written", f"{cpu:.3f}x",
                 f"wall {wall:.3f}x; target >= {TARGETS['loop']}x: {_verdict(cpu >= TARGETS['loop'])}"))
    return rows


def main() -> None:
    began = time.monotonic()
    rows = recovery_rows(recovery_runs()) + throughput_rows(throughput_runs())
    width = max(len(row[0]) for row in rows)
    print(f"(a) 2 torchrun agents, c10d, fast rdzv conf, SIGKILL one worker after the first snapshot; "
          f"median of {RECOVERY_REPEATS}")
    print(f"(b)(c) {FEATURES}-{HIDDEN}x{DEPTH}-{OUTPUTS} MLP + Adam (snapshot ~{snapshot_megabytes():.0f} MB), "
          f"{SAMPLES} samples x {EPOCHS} epochs, batch {BATCH}, 1 rank gloo, 1 torch thread; best of {REPEATS}; "
          f"samples/s per second of training-thread CPU (load-independent), wall clock beside it")
    for label, value, note in rows:
        print(f"{label:<{width}}  {value:>18}  {note}")
    print(f"(bench took {time.monotonic() - began:.0f} s; load average {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
