"""Hugging Face Transformers: atomic, verified snapshots, exact resume, progress and a graceful
stop for ``transformers.Trainer``, through :class:`ddpjob_trainer.Job`.

    from ddpjob_trainer.integrations.huggingface import DDPJobCallback

    ddpjob = DDPJobCallback()                      # snapshots in $DDPJOB_SNAPSHOT_DIR
    args = TrainingArguments(output_dir=ddpjob.staging_dir, save_strategy="steps", save_steps=500, ...)
    trainer = Trainer(model, args, train_dataset=data, callbacks=[ddpjob])
    ddpjob.train(trainer)                          # resumes from the newest verified snapshot

Hugging Face writes its checkpoint as a directory (weights, optimizer, scheduler, one RNG
file per rank, trainer_state.json) in place, and resumes from such a directory itself. The
callback keeps HF's format and moves each checkpoint, once every rank has written its part,
into the snapshot store as one directory snapshot: renamed into place with every file's
sha256 in a manifest written last (snapshots/tree.py). A checkpoint torn by a kill never gets
a manifest and is never resumed from; ``ddpjob.train`` hands HF the newest snapshot that
verifies, as rank 0 chose it, so every rank resumes from the same one, at the step after it:
HF restores the optimizer, scheduler, each rank's RNG state and skips the batches already
trained on.

Every optimizer step is reported (status STEP, progress-aware restart budget,
``ddpjob run --kill-node-after``); SIGTERM (preemption, ``kubectl delete pod``) makes every
rank save the same step and exit (stop.py); an exception out of ``ddpjob.train`` is recorded in
the progress record, and a :class:`~ddpjob_trainer.errors.DoNotRetry` fails the job at once.

What it needs from TrainingArguments: a save strategy (``save_strategy="steps"``/``"epoch"``),
``output_dir`` on a volume every node shares (``ddpjob.staging_dir``, under the snapshot
directory, is one: each rank writes its RNG file there), and neither ``save_only_model`` (the
snapshot would lack the optimizer and RNG states an exact resume needs) nor
``load_best_model_at_end`` (it looks for checkpoints in ``output_dir``, which the snapshot store
empties); ``save_total_limit`` is the store's ``keep`` instead. Resuming is exact at the world
size the snapshot was saved at (HF skips batches per rank).
"""
from __future__ import annotations

import os
import shutil
from typing import Any

import torch.distributed as torch_dist
from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from ddpjob_trainer.errors import DoNotRetry
from ddpjob_trainer.job import Job
from ddpjob_trainer.snapshots.agree import in_group_of_many

STAGING_NAME = ".hf-staging"  # where HF writes a checkpoint before it becomes a snapshot
CHECKPOINT_PREFIX = "checkpoint"  # HF's name for checkpoint-<global step> (transformers.trainer_utils)


class CheckpointSetupError(DoNotRetry):
    """TrainingArguments that the snapshot store cannot resume exactly from: every restart would
    repeat it, so the job fails at once."""

    reason = "InvalidCheckpointSetup"


class DDPJobCallback(TrainerCallback):
    """Routes HF's checkpoints through the snapshot store (see the module docstring).

    Args:
        job_kwargs: passed to :class:`~ddpjob_trainer.Job` (``snapshot_dir``, ``keep``, ...).

    Attributes:
        job: the Job (snapshot store, progress record, metrics).
        staging_dir: an ``output_dir`` on the snapshot volume, emptied at the training's start.
    """

    def __init__(self, **job_kwargs: Any):
        self.job = Job(**job_kwargs)
        self.staging_dir = os.path.join(self.job.directory, STAGING_NAME)
        self._epoch = 0
        self._stopping = False

    def resume_path(self) -> str | None:
        """The newest verified snapshot's directory, for ``trainer.train(resume_from_checkpoint=...)``;
        None to start fresh. Call it after constructing the Trainer (which starts the process group),
        so that every rank gets rank 0's choice."""
        info = self.job.latest()
        return info.path if info is not None else None

    def train(self, trainer: Trainer, **train_kwargs: Any) -> Any:
        """``trainer.train`` from the newest verified snapshot; a failure is recorded for the operator.

        Raises:
            GracefulStop, PeerStopped: SIGTERM stopped training after a snapshot (stop.py).
        """
        try:
            return trainer.train(resume_from_checkpoint=self.resume_path(), **train_kwargs)
        except BaseException as error:
            self.job.fail(error)  # a graceful stop only closes
            raise

    # -- HF's events (every rank) ----------------------------------------------------------

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: Any) -> None:
        _check(args)
        if self.job.rank == 0 and os.path.abspath(args.output_dir) == os.path.abspath(self.staging_dir):
            # A checkpoint a killed attempt left half-written: never resumed from, and its files
            # must not mix into the next checkpoint of the same step. Nobody saves before the
            # first step, which needs rank 0.
            shutil.rmtree(self.staging_dir, ignore_errors=True)
        self.job.watch_stop()

    def on_epoch_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: Any) -> None:
        self._epoch = int(state.epoch or 0)  # fractional inside an epoch that was resumed mid-way

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        self.job.global_step = state.global_step - 1  # HF's count is the truth (it resumed it itself)
        self.job.step(epoch=self._epoch)
        if self.job.stop_agreed():  # some rank got SIGTERM: snapshot this step, then stop
            self._stopping = True
            control.should_save = True
            control.should_training_stop = True

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                **kwargs: Any) -> None:
        if in_group_of_many():
            torch_dist.barrier()  # HF does not wait: every rank's RNG file is written after it
        checkpoint = os.path.join(args.output_dir, f"{CHECKPOINT_PREFIX}-{state.global_step}")
        if self.job.rank == 0:
            _check_complete(checkpoint, args.world_size)
        # epoch: epochs completed (state.epoch is exactly an integer at an epoch's last step).
        self.job.save_directory(checkpoint, epoch=int(state.epoch), step=state.global_step)
        if self._stopping:
            self.job.stop_here(state.global_step)

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        self.job.unwatch_stop()
        self.job.finish()


def _check(args: TrainingArguments) -> None:
    """Refuses the settings that make a snapshot unusable for an exact resume, naming each."""
    problems = [
        f"TrainingArguments.{name} ({getattr(getattr(args, name), 'value', getattr(args, name))!r}) must be {rule}"
        for name, rule, ok in [
            ("save_strategy", "'steps' or 'epoch' (snapshots are HF's checkpoints)",
             getattr(args.save_strategy, "value", args.save_strategy) in ("steps", "epoch")),
            ("save_only_model", "False (a resume needs the optimizer and RNG states)", not args.save_only_model),
            ("load_best_model_at_end", "False (checkpoints leave output_dir for the snapshot store)",
             not args.load_best_model_at_end),
        ]
        if not ok
    ]
    if problems:
        raise CheckpointSetupError("; ".join(problems))


def _check_complete(checkpoint: str, world_size: int) -> None:
    """Rank 0 sees every rank's part of the checkpoint (HF writes one RNG file per rank)."""
    if not os.path.isdir(checkpoint):
        raise CheckpointSetupError(f"HF's checkpoint {checkpoint} is missing after the save: output_dir must be "
                                   f"where the Trainer writes checkpoint-<step> (no hyperparameter search)")
    if world_size > 1:
        missing = [f"rng_state_{rank}.pth" for rank in range(world_size)
                   if not os.path.exists(os.path.join(checkpoint, f"rng_state_{rank}.pth"))]
        if missing:
            raise CheckpointSetupError(
                f"checkpoint {checkpoint} lacks {', '.join(missing)}: TrainingArguments.output_dir must be on a "
                f"volume every node shares (DDPJobCallback.staging_dir is), or the resume is not exact")
