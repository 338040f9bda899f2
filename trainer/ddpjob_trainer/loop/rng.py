"""Every random number generator a training step draws from, seeded, saved and restored per rank.

Exact resume needs each rank to continue the RNG streams it had (dropout masks, augmentation):
a snapshot holds every rank's state (gathered by rank 0, a collective), the fast tier each rank's
own, and a rank that did not exist at save time keeps a fresh seed. Only types that
``torch.load(weights_only=True)`` rebuilds are saved.
"""
from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch
import torch.distributed as torch_dist


def seed_everything(seed: int) -> None:
    """Seeds Python, numpy and torch (CPU and CUDA) RNGs."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    """This process's RNG states (Python, numpy, torch CPU, torch CUDA of the current device).

    Only types that ``torch.load(weights_only=True)`` rebuilds: Python's state is a tuple of
    ints, torch's are uint8 tensors, and numpy's legacy tuple (which holds an ndarray) is
    taken apart into a dict of plain values.
    """
    return {
        "python": random.getstate(),
        "numpy": numpy_rng_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
    }


def numpy_rng_state() -> dict[str, Any]:
    """np.random's global MT19937 state without numpy types: its 624 keys as a list of ints."""
    name, keys, pos, has_gauss, cached_gaussian = np.random.get_state(legacy=True)
    return {"name": str(name), "keys": [int(k) for k in keys], "pos": int(pos),
            "has_gauss": int(has_gauss), "cached_gaussian": float(cached_gaussian)}


def set_numpy_rng_state(state: Any) -> None:
    """Restores numpy_rng_state(); also numpy's own tuple, as snapshots of older ddpjob versions hold it."""
    if isinstance(state, dict):
        state = (state["name"], np.array(state["keys"], dtype=np.uint32), state["pos"], state["has_gauss"],
                 state["cached_gaussian"])
    np.random.set_state(state)


def set_rng_state(state: dict[str, Any]) -> None:
    """Restores what ``rng_state`` returned (tensors may arrive on a GPU through map_location)."""
    random.setstate(state["python"])
    set_numpy_rng_state(state["numpy"])
    torch.set_rng_state(state["torch"].cpu())
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"].cpu())


def gather_rng_states() -> list[dict[str, Any]]:
    """Every rank's RNG state, indexed by rank (a collective call)."""
    states: list[Any] = [None] * torch_dist.get_world_size()
    torch_dist.all_gather_object(states, rng_state())
    return states


def restore_rng(states: list[dict[str, Any]], rank: int) -> None:
    """Restores the saved state of ``rank``; a rank that did not exist at save time, or whose state
    was lost with its node (fast_resume.py), keeps its fresh seed."""
    if rank < len(states) and states[rank] is not None:
        set_rng_state(states[rank])
