"""Resuming from the fast tier: the new group agrees on the newest step every rank can load.

After a restart each rank may hold a copy in its node's shared memory (fast.py):
survivors of a worker restart do, the ranks of a replaced node do not, and a rank killed
mid-copy holds the step before. DDP replicas hold the same model and optimizer state, so one
copy of the newest step is enough for everyone:

1. **which round**: every resume starts a new *incarnation*, written into the copies made
   after it. Only copies of the newest incarnation count, so a node that missed a round (it
   was away while the others trained on from an older snapshot) cannot bring back a state of a
   history the others have since left;
2. **which step**: the all-reduced maximum over those copies, against the newest volume
   snapshot's step (rank 0 reads the manifests). The volume wins a tie unless every rank holds
   the step itself: its snapshot has every rank's RNG state;
3. **from where**: when every rank holds that step each loads its own copy; otherwise the
   lowest rank that holds it broadcasts the tensors (the volume is not read at all);
4. **RNG**: per-rank state that no other rank can save. Each copy carries its writer's RNG
   state and old rank; they are gathered, and new rank r gets old rank r's state as with a
   volume snapshot. A rank whose node was lost keeps a fresh seed (as a rank that did not
   exist at save time does), so a model that draws random numbers in training (dropout)
   follows another, equally valid, random stream after such a resume.

Every rank calls these functions: they are collectives.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as torch_dist

from ddpjob_trainer.snapshots.fast import FastSnapshot, skeleton_layout, unflatten


@dataclass(frozen=True)
class FastResume:
    """What the group agreed on: the step, and who broadcasts it (-1: every rank loads its own copy)."""

    step: int
    source: int


def agree(fast: FastSnapshot | None, volume_step: int, rank: int, world_size: int, device: torch.device
          ) -> tuple[FastResume | None, dict[str, Any] | None, int]:
    """The group's choice (None: resume from the volume), this rank's meta when it holds the step,
    and the incarnation to write from now on (a new one for every resume, whichever tier).

    Args:
        fast: this rank's fast tier (None when off: then it contributes nothing).
        volume_step: the newest volume snapshot's step on rank 0, -1 elsewhere or without one.
    """
    meta = fast.newest() if fast is not None else None
    mine_incarnation = int(meta.get("incarnation", 0)) if meta is not None else -1
    newest = int(_reduce([mine_incarnation], device, torch_dist.ReduceOp.MAX)[0])
    mine = int(meta["step"]) if meta is not None and mine_incarnation == newest else -1
    best, negated_lowest, volume = (int(v) for v in _reduce([mine, -mine, volume_step], device,
                                                            torch_dist.ReduceOp.MAX))
    everyone = -negated_lowest == best
    if best < 0 or best < volume or (best == volume and not everyone):
        return None, None, newest + 1
    holds = mine == best
    source = -1 if everyone else int(_reduce([rank if holds else world_size], device, torch_dist.ReduceOp.MIN)[0])
    return FastResume(best, source), (meta if holds else None), newest + 1


def load(choice: FastResume, fast: FastSnapshot | None, meta: dict[str, Any] | None, rank: int,
         device: torch.device) -> dict[str, Any]:
    """The agreed state on every rank, with ``rng`` the gathered per-old-rank RNG states
    (``fast`` None on a rank whose tier could not start: it receives the broadcast)."""
    if choice.source < 0:
        state = fast.load(meta, map_location=device)
    else:
        state = _broadcast(fast, meta, choice.source, rank, device)
    state["rng"] = _gather_rng(meta, state["world_size"])
    return state


def _broadcast(fast: FastSnapshot | None, meta: dict[str, Any] | None, source: int, rank: int,
               device: torch.device) -> dict[str, Any]:
    box = [skeleton_layout(meta) if rank == source else None]
    torch_dist.broadcast_object_list(box, src=source)
    skeleton, layout = box[0]
    if rank == source:
        tensors = fast.load_tensors(meta, map_location=device)
    else:
        tensors = [torch.empty(shape, dtype=dtype, device=device) for dtype, shape, _ in layout]
    for tensor in tensors:
        torch_dist.broadcast(tensor, src=source)
    return unflatten(skeleton, tensors)


def _gather_rng(meta: dict[str, Any] | None, old_world_size: int) -> list[dict[str, Any] | None]:
    mine = (int(meta["rank"]), meta["rng"]) if meta is not None else None
    gathered: list[Any] = [None] * torch_dist.get_world_size()
    torch_dist.all_gather_object(gathered, mine)
    states: list[dict[str, Any] | None] = [None] * old_world_size
    for item in gathered:
        if item is not None and item[0] < old_world_size:
            states[item[0]] = item[1]
    return states


def _reduce(values: list[int], device: torch.device, op: Any) -> list[int]:
    tensor = torch.tensor(values, dtype=torch.int64, device=device)
    torch_dist.all_reduce(tensor, op=op)
    return tensor.tolist()
