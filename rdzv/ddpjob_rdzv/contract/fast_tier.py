"""Where a node's fast snapshot tier lives (the Trainer's per-step copies in node-local memory).

The trainer writes there (ddpjob_trainer/snapshots/fast.py) and removes it when training
finishes; ``ddpjob run`` removes what its nodes left when the run ends (a node killed, a failed
or interrupted run), since on a machine of its own ``/dev/shm`` is RAM that nothing else frees.
One rule for both, so the two sides cannot name different directories.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

FAST_ROOT_ENV = "DDPJOB_FAST_SNAPSHOT_ROOT"  # where the copies live
DEFAULT_FAST_ROOT = "/dev/shm"


def fast_tier_dir(snapshot_dir: str | os.PathLike, node: str, root: str | os.PathLike | None = None) -> Path:
    """Node ``node``'s directory for the job that snapshots to ``snapshot_dir``: keyed by the
    snapshot directory (one job's, wherever several jobs share a machine) and the node."""
    base = Path(root or os.environ.get(FAST_ROOT_ENV) or DEFAULT_FAST_ROOT)
    job = hashlib.sha256(str(Path(snapshot_dir).resolve()).encode()).hexdigest()[:12]
    return base / f"ddpjob-fast-{job}-{node}"
