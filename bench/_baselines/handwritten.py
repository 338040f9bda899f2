"""A hand-written DDP training loop: the least a team would write itself, no snapshots, no metrics.

It is the yardstick for the trainer's own loop overhead in ``bench.trainer``:
DistributedSampler, DataLoader, DDP, zero_grad / forward / backward / step,
and nothing else per step (no logging, no loss synchronisation).
"""
from __future__ import annotations

import time
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
) -> list[float]:
    """Trains in the current process group; returns each optimizer step's seconds (end to end)."""
    ddp = DistributedDataParallel(model)
    sampler = DistributedSampler(dataset, seed=seed)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)
    durations = []
    last = time.perf_counter()
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for batch in loader:
            optimizer.zero_grad(set_to_none=True)
            loss_fn(ddp, batch).backward()
            optimizer.step()
            now = time.perf_counter()
            durations.append(now - last)
            last = now
    return durations
