"""A snapshot writer killed with SIGKILL in the middle of a save never costs the previous snapshot.

The writer runs in a subprocess that saves two snapshots and then blocks
inside the third save at a chosen fsync (the points where a real crash
leaves a partial temporary file or data without its manifest); the test
kills it there with SIGKILL and loads what is on disk.
"""
import logging
import subprocess
import sys
import textwrap

import pytest

from ddpjob_trainer.snapshots.store import SnapshotStore, snapshot_stem
from ddpjob_sandbox.procs import kill_process_group, start_in_own_group, stop_process_group

WRITER = textwrap.dedent(
    """
    import os, sys, time
    import torch
    from ddpjob_trainer.snapshots.store import SnapshotStore

    directory, block_at = sys.argv[1], int(sys.argv[2])
    store = SnapshotStore(directory, keep=2)
    for step in (1, 2):
        store.save({"w": torch.full((1000,), float(step))}, epoch=0, step=step)
    real_fsync, calls = os.fsync, [0]

    def fsync(fd):
        calls[0] += 1
        if calls[0] == block_at:
            print("BLOCKED", flush=True)
            time.sleep(600)
        real_fsync(fd)

    os.fsync = fsync
    store.save({"w": torch.full((4_000_000,), 3.0)}, epoch=0, step=3)
    print("SAVED", flush=True)
    """
)

# fsync calls in one save: 1 data file, 2 directory, 3 manifest file, 4 directory, 5 progress.json, 6 directory.
KILL_POINTS = {"while the data is in its temporary file": 1, "after the data rename, before the manifest": 3}


@pytest.mark.parametrize("block_at", KILL_POINTS.values(), ids=KILL_POINTS.keys())
def test_a_writer_killed_mid_save_leaves_the_previous_snapshot_and_deletes_nothing(tmp_path, block_at, caplog):
    writer = start_in_own_group([sys.executable, "-c", WRITER, str(tmp_path), str(block_at)], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "BLOCKED"
        kill_process_group(writer)  # SIGKILL: no cleanup handler runs, as in a node's death
        writer.wait(10)
    finally:
        stop_process_group(writer)
    names = {path.name for path in tmp_path.iterdir()}
    # keep=2 and two complete snapshots: the third save must not have deleted step 1 yet.
    for step in (1, 2):
        assert {f"{snapshot_stem(0, step)}.pt", f"{snapshot_stem(0, step)}.json"} <= names
    assert any(".tmp-" in name for name in names), f"the kill left no partial file: {sorted(names)}"

    with caplog.at_level(logging.WARNING):
        info, state = SnapshotStore(tmp_path, keep=2).load_latest()
    assert info.step == 2 and float(state["w"][0]) == 2.0
    assert not any(".tmp-" in path.name for path in tmp_path.iterdir()), "rank 0 removes leftovers on start"
    if block_at == KILL_POINTS["after the data rename, before the manifest"]:
        assert f"{tmp_path / snapshot_stem(0, 3)}.pt: it has no manifest" in caplog.text
        assert f"using previous snapshot {tmp_path / snapshot_stem(0, 2)}.pt" in caplog.text
