"""A hand-written DDP training loop: the least a team would write itself, no snapshots, no metrics.

It is the yardstick for the trainer's own loop overhead in ``bench.trainer``:
DistributedSampler, DataLoader, DDP, zero_grad / forward / backward / step,
and nothing else per step (no logging, no loss synchronisation).
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


def train(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    dataset: Dataset,
    loss_fn: Callable[[torch.nn.Module, tuple], torch.Tensor],
    *,
    epochs: int,
    batch_size: int,
    seed: int = 0,
) -> int:
    """Trains in the current process group; returns the number of optimizer steps."""
    ddp = DistributedDataParallel(model)
    sampler = DistributedSampler(dataset, seed=seed)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)
    steps = 0
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for batch in loader:
            optimizer.zero_grad(set_to_none=True)
            loss_fn(ddp, batch).backward()
            optimizer.step()
            steps += 1
    return steps
