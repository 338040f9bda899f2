"""The DDP training loop: resume from a snapshot, train, snapshot, repeat.

Follows torchrun's contract: any worker failure or membership change restarts
every worker, so the loop is written to be killed at any point. On start it
loads the newest complete snapshot *before* wrapping the model in DDP
(DDP broadcasts rank 0's parameters at construction, so every rank must hold
the restored weights by then) and continues at the first unfinished step:
a mid-epoch snapshot resumes inside its epoch, skipping exactly the samples
already trained on, also when the world size changed (see loop/sampler.py).

Only rank 0 writes snapshots and metrics; the other ranks do not wait for
the write to be durable. If rank 0 dies mid-save the group restarts from the
previous complete snapshot and redoes the steps since it: lost work, never
double-counted, because each restart's ``start`` event records the step it
resumed at and ``metrics.read_metrics`` rolls the lost steps back.

Usage (inside ``with distributed():``)::

    trainer = Trainer(
        model, optimizer, dataset,
        TrainerConfig(epochs=5, batch_size=32, snapshot_dir="/snapshots", snapshot_every_steps=100),
        loss_fn=lambda model, batch: F.mse_loss(model(batch[0]), batch[1]),
        scheduler=scheduler,
    )
    result = trainer.train()
"""
from __future__ import annotations

import contextlib
import datetime
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as torch_dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from ddpjob_rdzv.contract import NODE_INDEX_ENV

from ddpjob_trainer.dist import device_for
from ddpjob_trainer.env import DistEnv, dist_env
from ddpjob_trainer.job import Job
from ddpjob_trainer.loop.config import TrainerConfig
from ddpjob_trainer.loop.rng import gather_rng_states, restore_rng, rng_state, seed_everything
from ddpjob_trainer.loop.sampler import ResumableSampler
from ddpjob_trainer.report.heartbeats import Heartbeats
from ddpjob_trainer.report.metrics import Sink, TensorBoardSink, WandbSink
from ddpjob_trainer.snapshots import fast_resume
from ddpjob_trainer.snapshots.agree import load_agreed
from ddpjob_trainer.snapshots.fast import FastSnapshot, UnsafeDirectory, fast_root
from ddpjob_trainer.snapshots.store import SnapshotInfo

log = logging.getLogger(__name__)

LossFn = Callable[[torch.nn.Module, Any], torch.Tensor]


@dataclass
class Position:
    """Where training stands: the epoch to run, optimizer steps done, samples of that epoch done."""

    epoch: int = 0
    step: int = 0
    consumed: int = 0


@dataclass
class TrainResult:
    """What ``Trainer.train`` achieved in this attempt."""

    epochs: int
    step: int
    loss: float
    resumed_from: SnapshotInfo | None = None
    validation_loss: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class Trainer:
    """Trains ``model`` with DDP on ``train_data``; needs an initialized process group.

    Args:
        model: the model (moved to this rank's device; wrapped in DDP after the snapshot is loaded).
        optimizer: optimizer over ``model``'s parameters.
        train_data: map-style dataset; batches are collated by DataLoader.
        config: TrainerConfig.
        loss_fn: ``loss_fn(model, batch) -> scalar tensor``, batch already on the device.
        scheduler: LR scheduler, stepped after every optimizer step.
        val_data: validated on rank 0 after every epoch when given.
        env: the DistEnv (read from torchrun when omitted).
        extra: user state saved in and restored from every snapshot (``trainer.extra``).
            Snapshots load with ``weights_only=True``, so it may hold tensors,
            numbers, strings, None, and lists/tuples/dicts of them; a snapshot
            of anything else is refused at save time (SnapshotError), unless
            ``config.trust_snapshots`` (or ``DDPJOB_TRUST_SNAPSHOTS=1``).
        on_step: called on every rank with the global step after each optimizer step and its
            metrics; an exception from it fails the worker as one from the loop would (the
            example's fault injection, profiling hooks).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        train_data: Dataset,
        config: TrainerConfig,
        *,
        loss_fn: LossFn,
        scheduler: Any = None,
        val_data: Dataset | None = None,
        env: DistEnv | None = None,
        extra: dict[str, Any] | None = None,
        on_step: Callable[[int], None] | None = None,
    ):
        if not torch_dist.is_initialized():
            raise RuntimeError("Trainer needs a process group: construct it inside `with ddpjob_trainer.distributed():`")
        self.env = env or dist_env()
        self.config = config
        self.device = device_for(self.env)
        self.model = model.to(self.device)
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.loss_fn = loss_fn
        self.train_data = train_data
        self.val_data = val_data
        self.extra = dict(extra or {})
        self.on_step = on_step
        self.scaler = torch.amp.GradScaler("cuda") if config.amp and self.device.type == "cuda" else None
        self.position = Position()
        self.stop_agreed = False  # some rank was told to stop: this step is the last (every rank agrees)
        # The data order's seed; a resumed job keeps the snapshot's.
        self.sampler_seed = config.seed
        # The lifecycle every loop shares (job.py): snapshot store, progress report, metrics.
        self.job = self._make_job()
        self.store, self.report, self.metrics = self.job.store, self.job.report, self.job.metrics
        self.stop = self.job.stop  # installed while train() runs (stop.py)
        try:
            self.fast = self._make_fast()
            self.incarnation = 0  # which resume round writes the fast copies (snapshots/fast_resume.py)
            self.resumed_from = self._resume()
        except BaseException:
            self.job.close()  # no record of a failure here: the worker fails as it always did
            raise
        self.job.resume_at(self.resumed_from)
        self.heartbeats = self._make_heartbeats()
        self.metrics.sinks.extend(self._make_sinks())  # after the resume: W&B continues the saved run
        self.ddp = DistributedDataParallel(
            self.model,
            device_ids=[self.env.local_rank] if self.device.type == "cuda" else None,
            bucket_cap_mb=config.bucket_cap_mb,
        )

    # -- setup ---------------------------------------------------------------------

    def _make_job(self) -> Job:
        cfg, env = self.config, self.env
        if not cfg.snapshot_dir and env.is_rank0:
            log.warning("no snapshot directory: a restart will train from scratch")
        return Job.for_loop(rank=env.rank, local_rank=env.local_rank, world_size=env.world_size,
                            restart_count=env.restart_count, directory=cfg.snapshot_dir or None,
                            metrics_file=cfg.metrics_file, keep=cfg.snapshot_keep, async_save=cfg.async_snapshot,
                            trusted=cfg.trust_snapshots, on_unreadable=cfg.snapshot_on_unreadable)

    @property
    def fast_wanted(self) -> bool:
        """The configuration asks for the fast tier: the same answer on every rank, so every rank
        takes part in the fast tier's resume collective, whether its own tier could start or not."""
        return bool(self.config.fast_snapshot_every_steps and self.config.snapshot_dir)

    def _make_fast(self) -> FastSnapshot | None:
        if not self.fast_wanted:
            if self.config.fast_snapshot_every_steps and self.env.is_rank0:
                log.warning("the fast snapshot tier needs snapshot_dir: it is off")
            return None
        directory = fast_root(self.config.snapshot_dir, self.config.fast_snapshot_root)
        try:
            return FastSnapshot(directory, self.env.local_rank, self.env.local_world_size)
        except UnsafeDirectory:
            raise  # someone else's directory in our place: refused by name (docs/security.md)
        except OSError as error:  # no /dev/shm (not Linux), a read-only root: the tier is an optimization
            log.warning("fast snapshot tier off for local rank %d: cannot create %s (%s); a SIGKILL now loses the "
                        "steps since the last volume snapshot (set fast_snapshot_every_steps=0 to turn the tier "
                        "off without this warning)", self.env.local_rank, directory, error)
            return None

    def _make_heartbeats(self) -> Heartbeats:
        # Every rank beats into the group's store; each node's reporter gathers them (docs/hangs.md).
        store = torch_dist.distributed_c10d._get_default_store()
        heartbeats = Heartbeats(store, self.env.rank, self.env.world_size, os.environ.get(NODE_INDEX_ENV, ""))
        heartbeats.start(self.position.step)
        self.report.watch(heartbeats)
        return heartbeats

    def _make_sinks(self) -> list[Sink]:
        if not self.env.is_rank0:
            return []
        sinks: list[Sink] = []
        if self.config.tensorboard_dir:
            sinks.append(TensorBoardSink(self.config.tensorboard_dir))
        if self.config.wandb_project:
            sink = WandbSink(self.config.wandb_project, self.extra.get("wandb_run_id"), config=vars(self.config))
            self.extra["wandb_run_id"] = sink.run_id
            sinks.append(sink)
        return sinks

    def _resume(self) -> SnapshotInfo | None:
        seed_everything(self.config.seed + self.env.rank)
        if self.store is None:
            return None
        fast = self._resume_fast()
        if fast is not None:
            return fast
        info, state = self._choose_snapshot()
        if info is None:
            return None
        if state is None:
            state = self.store.load(info, map_location=self.device)
        self._restore(state)
        if self.env.is_rank0:
            log.info(
                "resumed from %s: epoch %d, step %d, %d samples of the epoch done (saved at world size %d, now %d)",
                info.path, info.epoch, info.step, info.samples_consumed, state["world_size"], self.env.world_size,
            )
        return info

    def _resume_fast(self) -> SnapshotInfo | None:
        """Resumes from the fast tier when the group agrees it holds a newer step than the volume
        (snapshots/fast_resume.py; a collective whenever the fast tier is on, so every rank takes part)."""
        if not self.fast_wanted:  # the same on every rank: off everywhere, no collective
            return None
        complete = self.store.complete() if self.env.is_rank0 else []
        volume_step = complete[-1].step if complete else -1
        choice, meta, self.incarnation = fast_resume.agree(self.fast, volume_step, self.env.rank,
                                                            self.env.world_size, self.device)
        if choice is None:
            return None
        state = fast_resume.load(choice, self.fast, meta, self.env.rank, self.device)
        self._restore(state)
        if self.env.is_rank0:
            log.info("resumed from the fast tier at step %d (%s)", choice.step,
                     "each rank's own copy" if choice.source < 0 else f"broadcast from rank {choice.source}")
        directory = fast_root(self.config.snapshot_dir, self.config.fast_snapshot_root)  # this node's (where it saves from now on)
        return SnapshotInfo(path=str(directory), epoch=state["epoch"], step=state["step"],
                            samples_consumed=state["samples_consumed"], time=state["time"])

    def _choose_snapshot(self) -> tuple[SnapshotInfo | None, dict[str, Any] | None]:
        """The snapshot rank 0 chose, on every rank (one rule with the bring-your-own-loop Job)."""
        return load_agreed(self.store, self.env.rank, map_location=self.device)

    def _restore(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler is not None and state.get("scaler") is not None:
            self.scaler.load_state_dict(state["scaler"])
        restore_rng(state["rng"], self.env.rank)
        self.position = Position(state["epoch"], state["step"], state["samples_consumed"])
        if state["sampler_seed"] != self.config.seed:
            log.warning("keeping the snapshot's data seed %d (config seed %d)", state["sampler_seed"], self.config.seed)
        self.sampler_seed = state["sampler_seed"]
        self.extra.update(state.get("extra") or {})

    # -- the loop ------------------------------------------------------------------

    def train(self) -> TrainResult:
        """Runs the remaining epochs; returns where training ended."""
        cfg = self.config
        self.job.start()
        loss, val_loss = math.nan, None
        try:
            with self.stop:
                for epoch in range(self.position.epoch, cfg.epochs):
                    loss = self._run_epoch(epoch)
                    with self.heartbeats.collective():  # snapshot and validation wait for the other ranks
                        val_loss = self._end_epoch(epoch, loss)
                        if self.stop_agreed and epoch + 1 < cfg.epochs:  # after the last epoch: done anyway
                            self._stop_here(None)  # _end_epoch saved the snapshot already
            if self.store is not None:
                self.store.wait()  # the final snapshot is complete (or its failure is training's)
            if self.fast is not None:
                self.fast.remove()  # finished: nothing will resume from memory
        except BaseException as error:
            self._close_loop(quiet=True)
            self.job.fail(error)  # the record says why; a DoNotRetry fails the pod now
            raise
        self._close_loop()
        self.job.epoch, self.job.global_step = cfg.epochs, self.position.step
        self.job.finish()  # the final snapshot complete, then "done"
        return TrainResult(cfg.epochs, self.position.step, loss, self.resumed_from, val_loss, self.extra)

    def _run_epoch(self, epoch: int) -> float:
        consumed = self.position.consumed if epoch == self.position.epoch else 0
        loader = self._loader(epoch, consumed)
        micro_batches = len(loader)
        accum = self.config.accumulation_steps
        bar = self._progress_bar(epoch, math.ceil(micro_batches / accum))
        losses: list[float] = []
        group_loss: torch.Tensor | None = None
        group_samples, last_time = 0, time.perf_counter()
        for index, batch in enumerate(loader):
            group_start = index - index % accum
            group_size = min(accum, micro_batches - group_start)
            last_micro = index + 1 == group_start + group_size
            loss = self._micro_step(batch, group_size, sync=last_micro)
            # Summed on the device: the host reads the loss once per optimizer step, not per micro-step.
            group_loss = loss if group_loss is None else group_loss + loss
            group_samples += _batch_len(batch)
            if not last_micro:
                continue
            loss = self._optimizer_step(group_loss if group_size == 1 else group_loss / group_size)
            consumed += group_samples * self.env.world_size
            now = time.perf_counter()
            self._after_step(epoch, loss, group_samples * self.env.world_size / (now - last_time), bar)
            losses.append(loss)
            with self.heartbeats.collective():  # a snapshot gathers every rank's RNG state
                if self.stop_agreed and index + 1 < micro_batches:
                    self._stop_here((epoch, consumed))
                self._maybe_step_snapshot(epoch, consumed, last_in_epoch=index + 1 == micro_batches)
                if self.fast is not None and index + 1 < micro_batches:  # the epoch's end: after _end_epoch
                    self._maybe_fast_snapshot(epoch, consumed)
            group_loss, group_samples, last_time = None, 0, time.perf_counter()
        bar.close()
        return float(np.mean(losses)) if losses else math.nan

    def _micro_step(self, batch: Any, group_size: int, sync: bool) -> torch.Tensor:
        """Forward and backward of one micro-batch; returns its loss, detached, still on the device
        (float64 when it is to be summed over an accumulation group, as the host would sum it)."""
        self.heartbeats.steps.batch_ready()
        batch = _to_device(batch, self.device)
        # no_sync: skip the gradient all-reduce on all but the last micro-step
        # of an accumulation group; gradients accumulate locally meanwhile.
        context = contextlib.nullcontext() if sync else self.ddp.no_sync()
        with context:
            loss = self._forward(batch)
            self.heartbeats.in_collective()
            scaled = loss if group_size == 1 else loss / group_size
            (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
        self.heartbeats.local()
        return loss.detach() if group_size == 1 else loss.detach().to(torch.float64)

    def _forward(self, batch: Any) -> torch.Tensor:
        if self.scaler is None and not torch.is_autocast_enabled(self.device.type):
            # Nothing to switch on or off: entering a disabled autocast still costs ~3 us a step.
            return self.loss_fn(self.ddp, batch)
        # Inside a caller's autocast: off unless amp is configured, as amp=False always meant.
        with torch.autocast(self.device.type, enabled=self.scaler is not None):
            return self.loss_fn(self.ddp, batch)

    def _optimizer_step(self, local_loss: torch.Tensor) -> float:
        if self.fast is not None:
            self.fast.wait()  # the previous step's copy reads the parameters this step changes
        reduction = self._start_loss_reduction(local_loss)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.scheduler is not None:
            self.scheduler.step()
        self.position.step += 1
        return self._finish_loss_reduction(reduction, local_loss)

    def _start_loss_reduction(self, local_loss: torch.Tensor) -> tuple[torch.Tensor, Any] | None:
        """Starts the all-reduce of [loss, stop flag]: the logged loss is the mean over all ranks,
        and the stop flag rides along, so every rank agrees on the last step at no extra cost.
        Started before the optimizer step, which hides its latency (measured: ~1.5 ms a step on a
        loaded 2-core machine when waited for at once, 3 % of the benchmark's step). None with
        one rank: there is nothing to reduce."""
        if self.env.world_size == 1:
            return None
        total = torch.tensor([0.0, float(self.stop.requested)], dtype=torch.float64, device=self.device)
        total[0] = local_loss  # copied on the device: the host reads the loss after the all-reduce
        return total, torch_dist.all_reduce(total, async_op=True)

    def _finish_loss_reduction(self, reduction: tuple[torch.Tensor, Any] | None, local_loss: torch.Tensor) -> float:
        """The step's loss as logged, read on the host after the optimizer step was started (on a
        GPU the read waits for the device: once a step, and only after it has the step's work)."""
        if reduction is None:
            self.stop_agreed = self.stop.requested
            return local_loss.item()
        total, work = reduction
        work.wait()
        loss_sum, stops = total.tolist()
        self.stop_agreed = stops > 0
        return loss_sum / self.env.world_size

    def _after_step(self, epoch: int, loss: float, samples_per_s: float, bar: tqdm) -> None:
        step = self.position.step
        self.metrics.write(
            "step", epoch=epoch, step=step, loss=loss, samples_per_s=round(samples_per_s, 2), world_size=self.env.world_size
        )
        if not bar.disable:  # the postfix is formatted even for a disabled bar (~3 us a step)
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.4f}", step=step)
        self.report.stepped()
        self.heartbeats.stepped(step)
        if self.on_step is not None:
            self.on_step(step)

    def _maybe_step_snapshot(self, epoch: int, consumed: int, last_in_epoch: bool) -> None:
        every = self.config.snapshot_every_steps
        # At the epoch's last step the end-of-epoch snapshot stands in, so that
        # a resume never replays the epoch's end.
        if every and self.position.step % every == 0 and not last_in_epoch:
            self._snapshot(epoch, consumed)

    def _end_epoch(self, epoch: int, loss: float) -> float | None:
        cfg, step = self.config, self.position.step
        self.metrics.write("epoch_end", epoch=epoch, step=step, loss=loss)
        val_loss = self._validate() if self.env.is_rank0 and self.val_data is not None else None
        if val_loss is not None:
            self.metrics.write("validation", epoch=epoch, step=step, loss=val_loss)
        if self.env.is_rank0:
            log.info("epoch %d done at step %d: loss %.5f, validation loss %s", epoch, step, loss, val_loss)
        due = (
            self.stop_agreed
            or (cfg.snapshot_every_epochs and (epoch + 1) % cfg.snapshot_every_epochs == 0)
            or (cfg.snapshot_every_steps and step % cfg.snapshot_every_steps == 0)
            or epoch + 1 == cfg.epochs
        )
        if due:
            self._snapshot(epoch + 1, 0)
        self.position = Position(epoch + 1, step, 0)
        if self.fast is not None:
            self._fast_snapshot(epoch + 1, 0)
        return val_loss

    @torch.no_grad()
    def _validate(self) -> float:
        model = self.ddp.module
        model.eval()
        loader = DataLoader(self.val_data, batch_size=self.config.batch_size, generator=torch.Generator())
        total, count = 0.0, 0
        for batch in loader:
            size = _batch_len(batch)
            total += self.loss_fn(model, _to_device(batch, self.device)).item() * size
            count += size
        model.train()
        return total / max(count, 1)

    # -- snapshots -----------------------------------------------------------------

    def _snapshot(self, epoch: int, consumed: int) -> None:
        """Saves (rank 0) the state to resume at ``epoch`` after ``consumed`` of its samples."""
        if self.store is None:
            return
        rng_states = gather_rng_states()  # collective: every rank calls _snapshot
        if not self.env.is_rank0:
            return
        self.job.save(self._state(epoch, consumed, rng_states), epoch=epoch, step=self.position.step,
                      samples_consumed=consumed)

    def _maybe_fast_snapshot(self, epoch: int, consumed: int) -> None:
        if self.position.step % self.config.fast_snapshot_every_steps == 0:
            self._fast_snapshot(epoch, consumed)

    def _fast_snapshot(self, epoch: int, consumed: int) -> None:
        """Starts this rank's copy to shared memory (no collective: every rank saves its own)."""
        state = self._state(epoch, consumed, None)
        state["time"] = _now()
        self.fast.save(state, step=self.position.step, incarnation=self.incarnation, rank=self.env.rank,
                       rng=rng_state())

    def _state(self, epoch: int, consumed: int, rng_states: list[dict[str, Any]] | None) -> dict[str, Any]:
        return {
            "model": self.ddp.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "epoch": epoch,
            "step": self.position.step,
            "samples_consumed": consumed,
            "sampler_seed": self.sampler_seed,
            "world_size": self.env.world_size,
            "rng": rng_states,
            "extra": self.extra,
        }

    def _stop_here(self, position: tuple[int, int] | None) -> None:
        """Ends a graceful stop at this step: the snapshot at ``position`` (epoch, consumed; None when
        already saved) complete, reported on every node, then GracefulStop or PeerStopped (stop.py)."""
        if position is not None:
            self._snapshot(*position)
        self.job.end_stop(self.position.step)

    def _loader(self, epoch: int, consumed: int) -> DataLoader:
        sampler = ResumableSampler(len(self.train_data), self.env.world_size, self.env.rank, seed=self.sampler_seed)
        sampler.set_epoch(epoch, consumed)
        # A private generator: DataLoader otherwise draws its worker seed from
        # the global RNG, which would make the RNG stream depend on where the
        # job resumed.
        generator = torch.Generator()
        generator.manual_seed(self.sampler_seed * 1_000_003 + epoch * 1009 + self.env.rank)
        return DataLoader(
            self.train_data,
            batch_size=self.config.batch_size,
            sampler=sampler,
            num_workers=self.config.num_workers,
            pin_memory=self.device.type == "cuda",
            generator=generator,
        )

    def _progress_bar(self, epoch: int, total: int) -> tqdm:
        return tqdm(
            total=total, desc=f"epoch {epoch}", unit="step", leave=False,
            disable=not (self.env.is_rank0 and self.config.progress_bar),
        )

    def _close_loop(self, quiet: bool = False) -> None:
        """What the loop adds to the Job's lifecycle: waits for the fast copy in flight and stops
        the heartbeats; ``quiet`` keeps the original error on top. The Job closes the rest."""
        try:
            if self.fast is not None:
                self.fast.wait()  # the newest copy is what a restart resumes from
        except Exception:
            if not quiet:
                raise
            log.exception("pending fast snapshot failed while training was already failing")
        finally:
            self.heartbeats.stop()


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def _to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {key: _to_device(value, device) for key, value in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to_device(value, device) for value in batch)
    return batch


def _batch_len(batch: Any) -> int:
    if isinstance(batch, torch.Tensor):
        return batch.shape[0]
    if isinstance(batch, dict):
        return _batch_len(next(iter(batch.values())))
    return _batch_len(batch[0])
