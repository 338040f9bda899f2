"""Agreeing on the snapshot to load: rank 0 chooses, every rank loads the same one.

A shared volume may show a new snapshot to one node before another, and a snapshot may fail to
verify on one reader only; so rank 0 decides (the newest that verifies, or the verdict that none
can be read) and broadcasts its answer, and every rank acts on it alike (none is left waiting in
a collective). Used by the Job (job.py) under every loop; the fast tier agrees on its own
(fast_resume.py), because its copies are per rank.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch.distributed as torch_dist

from ddpjob_trainer.snapshots.store import SnapshotInfo, SnapshotsUnreadableError, SnapshotStore

_Answer = TypeVar("_Answer")


def load_agreed(store: SnapshotStore, rank: int, map_location: Any = None
                ) -> tuple[SnapshotInfo | None, dict[str, Any] | None]:
    """The newest readable snapshot, as rank 0 chose it, on every rank.

    With a process group rank 0 loads and broadcasts which file, so every rank loads the same
    one even if a shared volume shows new files late, and rank 0's verdict that none can be
    read is raised on every rank alike (none waits in a collective). Without a process group
    (or a world of one) each rank reads the newest itself.

    Raises:
        SnapshotsUnreadableError: snapshots exist but none can be read (spec.snapshot.onUnreadable: Fail).
    """
    found = None

    def choose() -> SnapshotInfo | None:
        nonlocal found
        found = store.load_latest(map_location=map_location)
        return found[0] if found else None

    info = _decided_by_rank0(rank, choose)
    if info is None:
        return None, None
    return info, found[1] if found else store.load(info, map_location=map_location)


def latest_agreed(store: SnapshotStore, rank: int) -> SnapshotInfo | None:
    """The newest snapshot that verifies, as rank 0 chose it, on every rank, not loaded (for a
    framework that loads its own checkpoint directory); the rule of :func:`load_agreed`.

    Raises:
        SnapshotsUnreadableError: snapshots exist but none verifies (spec.snapshot.onUnreadable: Fail).
    """
    return _decided_by_rank0(rank, store.latest)


def _decided_by_rank0(rank: int, decide: Callable[[], _Answer]) -> _Answer:
    """``decide()`` on rank 0, and its answer, or its SnapshotsUnreadableError, on every rank (one
    broadcast); without a process group of more than one, each rank decides itself."""
    if not in_group_of_many():
        return decide()
    answer, verdict = None, None
    if rank == 0:
        try:
            answer = decide()
        except SnapshotsUnreadableError as error:
            verdict = str(error)
    chosen = [(answer, verdict)]
    torch_dist.broadcast_object_list(chosen, src=0)
    answer, verdict = chosen[0]
    if verdict is not None:
        raise SnapshotsUnreadableError(verdict)
    return answer


def in_group_of_many() -> bool:
    """Whether a process group of more than one rank is running (collectives would wait for peers)."""
    return torch_dist.is_available() and torch_dist.is_initialized() and torch_dist.get_world_size() > 1
