"""A distributed sampler that can resume in the middle of an epoch, at any world size.

``torch.utils.data.DistributedSampler`` shards a per-epoch permutation by
rank, so a job that restarts mid-epoch must either re-run the epoch or know
which samples every old rank had already seen. This sampler makes that
bookkeeping a single number:

1. the epoch's order is a permutation of the *whole* dataset drawn from
   ``seed + epoch`` (independent of the world size);
2. ranks take the order round-robin (rank r gets positions r, r+W, r+2W, ...),
   so after every rank consumed ``b`` samples the consumed set is exactly the
   prefix ``order[:b * W]``;
3. on resume the trainer passes ``consumed`` (global count, saved in the
   snapshot); the prefix is dropped and the rest is sharded across the
   *current* world size.

Every rank gets the same number of samples (so DDP ranks run the same number
of steps); the fewer than ``num_replicas`` samples left over at the end of an
epoch are not used in that epoch, as with ``DistributedSampler(drop_last=True)``.

Usage::

    sampler = ResumableSampler(len(dataset), num_replicas=W, rank=r, seed=0)
    sampler.set_epoch(epoch, consumed=snapshot_consumed)   # 0 for a fresh epoch
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)
"""
from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler


class ResumableSampler(Sampler[int]):
    """Round-robin shard of a seeded per-epoch permutation, minus a consumed prefix.

    Args:
        dataset_size: number of samples in the dataset.
        num_replicas: current world size.
        rank: this worker's global rank.
        seed: base seed; the epoch order depends only on ``seed + epoch``.
        shuffle: permute each epoch (otherwise the natural order 0..N-1).
    """

    def __init__(self, dataset_size: int, num_replicas: int, rank: int, seed: int = 0, shuffle: bool = True):
        if num_replicas < 1:
            raise ValueError(f"num_replicas ({num_replicas}) must be >= 1")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank ({rank}) must be in [0, num_replicas={num_replicas})")
        self.dataset_size = dataset_size
        self.num_replicas = num_replicas
        self.rank = rank
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.consumed = 0

    def set_epoch(self, epoch: int, consumed: int = 0) -> None:
        """Selects the epoch, skipping the first ``consumed`` samples of its global order."""
        if not 0 <= consumed <= self.dataset_size:
            raise ValueError(f"consumed ({consumed}) must be in [0, dataset size {self.dataset_size}]")
        self.epoch = epoch
        self.consumed = consumed

    def epoch_order(self) -> list[int]:
        """The whole epoch's global sample order (the same at every world size)."""
        if not self.shuffle:
            return list(range(self.dataset_size))
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        return torch.randperm(self.dataset_size, generator=generator).tolist()

    def __len__(self) -> int:
        return (self.dataset_size - self.consumed) // self.num_replicas

    def __iter__(self) -> Iterator[int]:
        remaining = self.epoch_order()[self.consumed :]
        usable = len(self) * self.num_replicas
        return iter(remaining[self.rank : usable : self.num_replicas])
