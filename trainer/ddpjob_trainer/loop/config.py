"""The Trainer's knobs: one dataclass, every rule checked at construction with its field and value.

Kept apart from the loop (trainer.py) so a script, a test or ``ddpjob run`` can build and check a
configuration without importing torch.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from ddpjob_trainer.env import ON_UNREADABLE_CHOICES


@dataclass
class TrainerConfig:
    """Knobs of the training loop.

    Attributes:
        epochs: epochs to train in total (across restarts).
        batch_size: samples per rank per micro-step.
        accumulation_steps: micro-steps per optimizer step (gradients are
            all-reduced only on the last one).
        seed: seed for the data order and the initial RNG state.
        snapshot_dir: shared snapshot directory; None disables snapshots (a
            restart then trains from scratch).
        snapshot_every_epochs: snapshot after every N epochs (0 = off).
        snapshot_every_steps: snapshot after every M optimizer steps (0 = off).
        snapshot_keep: complete snapshots to keep.
        async_snapshot: write snapshots in a background thread.
        metrics_file: JSON-lines metrics file written by rank 0 (None = off).
        bucket_cap_mb: DDP gradient bucket size.
        amp: mixed precision with a GradScaler (CUDA only; ignored on CPU).
        num_workers: DataLoader worker processes.
        progress_bar: tqdm bar on rank 0.
        tensorboard_dir: also log scalars to TensorBoard (needs tensorboard).
        wandb_project: also log scalars to W&B (needs wandb); the run id is kept in the snapshot.
        trust_snapshots: load snapshots with ``torch.load(weights_only=False)``,
            which runs any code a snapshot holds, and save any picklable ``extra``;
            only for a snapshot directory whose every writer is trusted (e.g. to
            resume from snapshots of an older ddpjob). None reads
            ``DDPJOB_TRUST_SNAPSHOTS=1`` (default off: see SnapshotStore for what
            a state may then hold).
        snapshot_on_unreadable: ``Fail`` (raise SnapshotsUnreadableError) or
            ``StartOver`` (train from scratch) when snapshots exist but none can
            be read; None reads ``DDPJOB_SNAPSHOT_ON_UNREADABLE``, which the
            operator renders from ``spec.snapshot.onUnreadable`` (default ``Fail``).
        fast_snapshot_every_steps: also copy every rank's state to node-local shared memory
            after every N optimizer steps (default 1: every step; 0 = off; needs snapshot_dir): a
            worker restart then resumes from there, losing at most the steps since the copy
            (snapshots/fast.py). Where the two copies do not fit (the filesystem or the memory
            limit), the tier turns itself off with one warning and training goes on.
        fast_snapshot_root: where those copies live (None: $DDPJOB_FAST_SNAPSHOT_ROOT, else /dev/shm).
    """

    epochs: int
    batch_size: int = 32
    accumulation_steps: int = 1
    seed: int = 0
    snapshot_dir: str | None = None
    snapshot_every_epochs: int = 1
    snapshot_every_steps: int = 0
    snapshot_keep: int = 2
    async_snapshot: bool = False
    metrics_file: str | None = None
    bucket_cap_mb: float = 25.0
    amp: bool = False
    num_workers: int = 0
    progress_bar: bool = True
    tensorboard_dir: str | None = None
    wandb_project: str | None = None
    trust_snapshots: bool | None = None
    snapshot_on_unreadable: str | None = None
    fast_snapshot_every_steps: int = 1
    fast_snapshot_root: str | None = None

    def __post_init__(self) -> None:
        problems = [
            f"TrainerConfig.{f.name} ({getattr(self, f.name)}) must be {rule}"
            for f in fields(self)
            for rule in [_RULES.get(f.name)]
            if rule is not None and not _RULE_CHECKS[rule](getattr(self, f.name))
        ]
        if problems:
            raise ValueError("; ".join(problems))


_RULES = {
    "epochs": ">= 1",
    "batch_size": ">= 1",
    "accumulation_steps": ">= 1",
    "snapshot_every_epochs": ">= 0",
    "snapshot_every_steps": ">= 0",
    "fast_snapshot_every_steps": ">= 0",
    "snapshot_keep": ">= 1",
    "bucket_cap_mb": "> 0",
    "num_workers": ">= 0",
    "snapshot_on_unreadable": "None, 'Fail' or 'StartOver'",
}
_RULE_CHECKS = {">= 1": lambda v: v >= 1, ">= 0": lambda v: v >= 0, "> 0": lambda v: v > 0,
                "None, 'Fail' or 'StartOver'": lambda v: v is None or v in ON_UNREADABLE_CHOICES}
