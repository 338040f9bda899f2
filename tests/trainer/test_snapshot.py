"""SnapshotStore: complete, verified, pruned snapshots; corrupt ones skipped; async saves ordered."""
import json
import logging
import random
import threading

import numpy as np
import pytest
import torch

from ddpjob_trainer.snapshots import store as snapshot_module
from ddpjob_trainer.snapshots.store import SnapshotError, SnapshotsUnreadableError, SnapshotStore, snapshot_stem
from ddpjob_trainer.loop.rng import rng_state, set_rng_state


def state_at(step, size=64):
    return {"model": {"w": torch.full((size,), float(step))}, "step": step, "extra": {"note": f"s{step}"}}


def files_in(directory):
    return sorted(path.name for path in directory.iterdir())


def test_a_saved_snapshot_loads_back_with_its_manifest_and_progress_file(tmp_path):
    store = SnapshotStore(tmp_path)
    store.save(state_at(7), epoch=1, step=7, samples_consumed=96)
    info, state = store.load_latest()
    assert (info.epoch, info.step, info.samples_consumed) == (1, 7, 96)
    assert info.path == str(tmp_path / "snapshot-s0000000007-e000001.pt")
    assert torch.equal(state["model"]["w"], torch.full((64,), 7.0)) and state["extra"] == {"note": "s7"}
    manifest = json.loads((tmp_path / "snapshot-s0000000007-e000001.json").read_text())
    assert manifest["file"] == "snapshot-s0000000007-e000001.pt" and manifest["format"] == 1
    assert manifest["size"] == (tmp_path / manifest["file"]).stat().st_size and len(manifest["sha256"]) == 64
    progress = json.loads((tmp_path / "progress.json").read_text())
    assert progress == {"epoch": 1, "step": 7, "samples_consumed": 96, "path": info.path, "time": info.time}


def test_only_the_newest_keep_snapshots_remain(tmp_path):
    store = SnapshotStore(tmp_path, keep=2)
    for step in (1, 2, 3, 4):
        store.save(state_at(step), epoch=0, step=step)
    assert files_in(tmp_path) == sorted(
        ["progress.json"] + [f"{snapshot_stem(0, s)}{ext}" for s in (3, 4) for ext in (".pt", ".json")]
    )
    assert [info.step for info in store.complete()] == [3, 4]


def test_an_empty_directory_has_no_snapshot(tmp_path):
    assert SnapshotStore(tmp_path / "new").load_latest() is None


def test_ranks_other_than_0_never_write(tmp_path):
    SnapshotStore(tmp_path, rank=1).save(state_at(1), epoch=0, step=1)
    assert files_in(tmp_path) == []


def corrupt(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_corrupt_newest_snapshot_is_skipped_with_a_warning_naming_both_files(tmp_path, caplog):
    store = SnapshotStore(tmp_path, keep=3)
    for step in (1, 2):
        store.save(state_at(step), epoch=0, step=step)
    newest, previous = tmp_path / f"{snapshot_stem(0, 2)}.pt", tmp_path / f"{snapshot_stem(0, 1)}.pt"
    corrupt(newest)
    with caplog.at_level(logging.WARNING):
        info, state = store.load_latest()
    assert info.step == 1 and state["step"] == 1
    assert f"skipped snapshot(s) {newest}: sha256 does not match the manifest (corrupt data); " \
           f"using previous snapshot {previous}" in caplog.text


def test_a_truncated_newest_snapshot_is_skipped(tmp_path, caplog):
    store = SnapshotStore(tmp_path)
    for step in (1, 2):
        store.save(state_at(step), epoch=0, step=step)
    newest = tmp_path / f"{snapshot_stem(0, 2)}.pt"
    newest.write_bytes(newest.read_bytes()[:100])
    with caplog.at_level(logging.WARNING):
        assert store.latest().step == 1
    assert f"{newest}: size 100 bytes does not match the manifest's" in caplog.text


def test_data_without_a_manifest_counts_as_an_interrupted_save(tmp_path, caplog):
    store = SnapshotStore(tmp_path)
    store.save(state_at(1), epoch=0, step=1)
    orphan = tmp_path / f"{snapshot_stem(0, 2)}.pt"
    torch.save(state_at(2), orphan)
    with caplog.at_level(logging.WARNING):
        assert store.latest().step == 1
    assert f"{orphan}: it has no manifest (save was interrupted)" in caplog.text


def test_when_every_snapshot_is_unreadable_loading_fails_naming_each_file_and_why(tmp_path):
    store = SnapshotStore(tmp_path, keep=3)
    for step in (1, 2, 3):
        store.save(state_at(step), epoch=0, step=step)
    first, second, third = (tmp_path / f"{snapshot_stem(0, step)}.pt" for step in (1, 2, 3))
    corrupt(first)
    second.write_bytes(second.read_bytes()[:100])
    third.with_suffix(".json").write_text("{")
    size = third.stat().st_size  # the data of the third is fine; its manifest is not

    with pytest.raises(SnapshotsUnreadableError) as raised:
        store.load_latest()
    assert str(raised.value) == (
        f"none of the snapshots in {tmp_path} can be read, and resuming without one would restart training "
        f"from step 0:\n"
        f"  {third.with_suffix('.json')}: its manifest is unreadable (Expecting property name enclosed in double "
        f"quotes: line 1 column 2 (char 1))\n"
        f"  {second}: size 100 bytes does not match the manifest's {size}\n"
        f"  {first}: sha256 does not match the manifest (corrupt data)\n"
        f"Repair or remove them; or, if they are only refused by weights_only and every writer of the directory "
        f"is trusted, set DDPJOB_TRUST_SNAPSHOTS=1; or set spec.snapshot.onUnreadable: StartOver "
        f"(DDPJOB_SNAPSHOT_ON_UNREADABLE=StartOver) to train from scratch")
    with pytest.raises(SnapshotsUnreadableError):
        store.latest()  # choosing without loading applies the same rule


def test_with_start_over_unreadable_snapshots_are_named_in_a_warning_and_training_starts_from_scratch(
        tmp_path, caplog, monkeypatch):
    SnapshotStore(tmp_path).save(state_at(1), epoch=0, step=1)
    corrupt(tmp_path / f"{snapshot_stem(0, 1)}.pt")
    monkeypatch.setenv("DDPJOB_SNAPSHOT_ON_UNREADABLE", "StartOver")
    with caplog.at_level(logging.WARNING):
        assert SnapshotStore(tmp_path).load_latest() is None
    assert (f"no usable snapshot in {tmp_path}; skipped {tmp_path / snapshot_stem(0, 1)}.pt: sha256 does not match "
            f"the manifest (corrupt data); starting from scratch (DDPJOB_SNAPSHOT_ON_UNREADABLE=StartOver)"
            in caplog.text)


def test_data_of_a_first_save_that_never_completed_is_no_snapshot_to_fail_on(tmp_path, caplog):
    torch.save(state_at(1), tmp_path / f"{snapshot_stem(0, 1)}.pt")  # killed before its manifest
    with caplog.at_level(logging.WARNING):
        assert SnapshotStore(tmp_path).load_latest() is None
    assert "it has no manifest (save was interrupted)" in caplog.text


def test_keep_must_be_at_least_one(tmp_path):
    with pytest.raises(ValueError, match=r"SnapshotStore keep \(0\) must be >= 1"):
        SnapshotStore(tmp_path, keep=0)


class GatedWrites:
    """Holds the data write of the first snapshot until released (a slow disk)."""

    def __init__(self, monkeypatch):
        self.release = threading.Event()
        self.first_started = threading.Event()
        self.order = []
        real = snapshot_module._atomic_write

        def gated(path, write, *check):
            if path.suffix == ".pt":
                self.order.append(path.name)
                if len(self.order) == 1:
                    self.first_started.set()
                    assert self.release.wait(10)
            return real(path, write, *check)

        monkeypatch.setattr(snapshot_module, "_atomic_write", gated)


def test_an_async_save_copies_the_state_and_the_next_save_waits_for_it(tmp_path, monkeypatch):
    gate = GatedWrites(monkeypatch)
    store = SnapshotStore(tmp_path, async_save=True)
    live = state_at(1)
    store.save(live, epoch=0, step=1)          # returns while the write is held
    assert gate.first_started.wait(10)
    live["model"]["w"].add_(100.0)            # training goes on mutating the parameters
    second = threading.Thread(target=store.save, args=(state_at(2),), kwargs={"epoch": 0, "step": 2})
    second.start()
    second.join(0.5)
    assert second.is_alive(), "the second save must wait for the first"
    assert gate.order == [f"{snapshot_stem(0, 1)}.pt"]
    gate.release.set()
    second.join(10)
    store.close()
    assert gate.order == [f"{snapshot_stem(0, 1)}.pt", f"{snapshot_stem(0, 2)}.pt"]
    first = store.load(store.complete()[0])
    assert torch.equal(first["model"]["w"], torch.full((64,), 1.0)), "the copy taken at save time is written"
    assert store.latest().step == 2


def test_an_async_save_error_is_raised_by_the_next_call(tmp_path, monkeypatch):
    store = SnapshotStore(tmp_path, async_save=True)

    def failing(path, write, *check):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(snapshot_module, "_atomic_write", failing)
    store.save(state_at(1), epoch=0, step=1)
    with pytest.raises(SnapshotError, match=f"asynchronous snapshot save to {tmp_path} failed: .*No space left"):
        store.save(state_at(2), epoch=0, step=2)
    store.close()  # the error was reported once


def next_draws():
    generator_batch = next(iter(torch.utils.data.DataLoader(list(range(100)), batch_size=8, shuffle=True)))
    return random.random(), np.random.rand(3).tolist(), torch.rand(3).tolist(), generator_batch.tolist()


def test_restoring_the_saved_rng_state_reproduces_the_next_shuffled_batch(tmp_path):
    store = SnapshotStore(tmp_path)
    torch.manual_seed(5)
    store.save({"rng": [rng_state()]}, epoch=0, step=1)
    expected = next_draws()
    assert next_draws() != expected
    set_rng_state(store.load_latest()[1]["rng"][0])
    assert next_draws() == expected
