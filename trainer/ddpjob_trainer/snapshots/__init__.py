"""Snapshots: atomic, verified training state on the volume every node shares, and a fast copy in memory.

    background.py   one job at a time on a thread of its own (the async writer of both tiers)
    tree.py         a directory as one snapshot (a framework's own checkpoint): hashing, taking in
    store.py        SnapshotStore: temp file, fsync, rename, sha256 manifest, progress.json, keep N
    fast.py         the fast tier: each rank's state in node-local shared memory every few steps
    fast_resume.py  resuming from the fast tier: the group agrees on the newest step all can load
    agree.py        resuming from the volume: rank 0 chooses the snapshot, every rank loads it

Nothing here knows the training loop or the progress report: the Job (job.py) wires a store to
them, and the Trainer (trainer.py) adds the fast tier.
"""
