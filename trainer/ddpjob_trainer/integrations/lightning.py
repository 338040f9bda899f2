"""PyTorch Lightning: atomic snapshots, resume and progress through :class:`ddpjob_trainer.Job`.

    from ddpjob_trainer.integrations.lightning import DDPJobCallback

    ddpjob = DDPJobCallback()                      # snapshots in $DDPJOB_SNAPSHOT_DIR
    trainer = L.Trainer(callbacks=[ddpjob], enable_checkpointing=False, strategy="ddp", ...)
    trainer.fit(model, data, ckpt_path=ddpjob.resume_path())   # None on a fresh start

The callback saves Lightning's whole checkpoint (weights, optimizers, schedulers, loop state)
after every ``every_n_epochs`` epochs with SnapshotStore instead of Lightning's in-place
``torch.save``: it installs itself as the strategy's CheckpointIO, so ``trainer.save_checkpoint``
goes through it too. Turn off Lightning's own ModelCheckpoint (``enable_checkpointing=False``),
which would otherwise save a second time. Every optimizer step is reported (status STEP,
progress-aware restart budget, ``ddpjob run --kill-node-after``); an exception is recorded in
the progress record, a :class:`~ddpjob_trainer.errors.DoNotRetry` fails the job at once.
A LightningModule whose hyper-parameters hold other than plain types needs
``DDPJOB_TRUST_SNAPSHOTS=1`` (see SnapshotStore: snapshots load with ``weights_only``).
"""
from __future__ import annotations

import os
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.plugins.io import CheckpointIO

from ddpjob_trainer.job import Job


class _SnapshotIO(CheckpointIO):
    """Lightning's CheckpointIO backed by the job's SnapshotStore (the path is only a label)."""

    def __init__(self, job: Job):
        self.job = job
        self.resume_epoch: int | None = None  # set by the callback for end-of-epoch saves

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike,
                        storage_options: Any = None) -> None:
        epoch = self.resume_epoch if self.resume_epoch is not None else checkpoint["epoch"]
        self.job.save(checkpoint, epoch=epoch, step=checkpoint["global_step"])

    def load_checkpoint(self, path: str | os.PathLike, map_location: Any = None,
                        weights_only: bool | None = None) -> dict[str, Any]:
        state = self.job.load(map_location=map_location)  # the newest, as rank 0 chose it
        if state is None:
            raise FileNotFoundError(f"no complete snapshot in {self.job.directory} (asked for {path})")
        return state

    def remove_checkpoint(self, path: str | os.PathLike) -> None:
        pass  # SnapshotStore keeps the newest `keep` and deletes the rest itself


class DDPJobCallback(pl.Callback):
    """Snapshots every ``every_n_epochs`` epochs and progress on every step (see the module docstring).

    Args:
        every_n_epochs: save after every this many training epochs (and after the last).
        job_kwargs: passed to :class:`~ddpjob_trainer.Job` (``snapshot_dir``, ``keep``, ...).
    """

    def __init__(self, every_n_epochs: int = 1, **job_kwargs: Any):
        self.every_n_epochs = every_n_epochs
        self.job = Job(**job_kwargs)
        self.io = _SnapshotIO(self.job)

    def resume_path(self) -> str | None:
        """The newest complete snapshot, for ``trainer.fit(..., ckpt_path=...)``; None to start fresh."""
        info = self.job.store.latest()
        return info.path if info is not None else None

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        trainer.strategy.checkpoint_io = self.io

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        if trainer.global_step > self.job.global_step:  # an optimizer step (not an accumulation)
            loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
            self.job.step(loss=float(loss) if loss is not None else None, epoch=trainer.current_epoch)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        done = trainer.current_epoch + 1
        if done % self.every_n_epochs == 0 or done == trainer.max_epochs:
            self.io.resume_epoch = done
            try:  # every rank calls it (a barrier); the strategy writes on global rank 0 only
                trainer.save_checkpoint(os.path.join(self.job.directory, f"lightning-epoch-{done}"))
            finally:
                self.io.resume_epoch = None

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.job.finish()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self.job.fail(exception)
