"""SnapshotStore.save_directory: a framework's checkpoint directory held as one atomic, verified
snapshot (snapshots/tree.py). A directory torn at any point of its save, or changed after it,
is never chosen; the previous complete snapshot is."""
import json
import os
from pathlib import Path

import pytest
import torch

from ddpjob_trainer.snapshots.store import SnapshotError, SnapshotsUnreadableError, SnapshotStore


def checkpoint(root, step, files=None):
    """A checkpoint directory as a framework writes it (nested folder included)."""
    path = root / f"checkpoint-{step}"
    (path / "shards").mkdir(parents=True)
    for name, content in (files or {"model.safetensors": f"weights {step}", "trainer_state.json": "{}",
                                     "shards/part-0": "x" * 3000}).items():
        (path / name).write_text(content)
    return path


@pytest.fixture
def store(tmp_path):
    return SnapshotStore(tmp_path / "snapshots", keep=2)


def saved(store, tmp_path, step, epoch=0):
    store.save_directory(checkpoint(tmp_path / "staging", step), epoch=epoch, step=step)
    return store.latest()


def test_a_saved_directory_is_moved_in_and_its_manifest_lists_every_file_with_its_digest(store, tmp_path):
    source = checkpoint(tmp_path / "staging", 10)
    store.save_directory(source, epoch=1, step=10)
    info = store.latest()
    assert not source.exists(), "moved, not copied"
    assert info.path.endswith("snapshot-s0000000010-e000001.d") and (info.epoch, info.step) == (1, 10)
    assert (info.path and open(os.path.join(info.path, "model.safetensors")).read()) == "weights 10"
    manifest = json.loads(info.manifest_path.read_text())
    assert manifest["format"] == 2 and manifest["file"] == "snapshot-s0000000010-e000001.d"
    assert [entry["path"] for entry in manifest["files"]] == ["model.safetensors", "shards/part-0",
                                                              "trainer_state.json"]
    assert manifest["size"] == len("weights 10") + 3000 + 2
    progress = json.loads((tmp_path / "snapshots" / "progress.json").read_text())
    assert (progress["step"], progress["path"]) == (10, info.path)


@pytest.mark.parametrize(("damage", "why"), [
    (lambda d: (d / "model.safetensors").write_text("weights 99"), "model.safetensors: sha256 does not match"),
    (lambda d: (d / "model.safetensors").write_text("short"), "model.safetensors: size 5 bytes does not match"),
    (lambda d: (d / "shards" / "part-0").unlink(), "shards/part-0 is missing"),
    (lambda d: (d / "pytorch_model.bin").write_text("planted"), "it holds pytorch_model.bin, which its manifest"),
], ids=["changed", "shortened", "missing", "planted"])
def test_a_directory_changed_after_its_save_is_skipped_for_the_previous_one(store, tmp_path, caplog, damage, why):
    older = saved(store, tmp_path, 10)
    newer = saved(store, tmp_path, 20)
    damage(Path(newer.path))
    assert store.latest() == older
    assert why in caplog.text and f"using previous snapshot {older.path}" in caplog.text


def test_a_directory_whose_manifest_never_came_is_not_resumed_from_and_is_pruned_later(store, tmp_path, caplog):
    older = saved(store, tmp_path, 10)
    newer = saved(store, tmp_path, 20)
    newer.manifest_path.unlink()  # killed after the rename, before the manifest
    assert store.latest() == older
    assert "it has no manifest (save was interrupted)" in caplog.text
    saved(store, tmp_path, 30)  # keep=2: 10 and 30 complete; the torn 20 is older than the newest
    assert sorted(p.name for p in (tmp_path / "snapshots").iterdir() if p.suffix == ".d") == [
        "snapshot-s0000000010-e000000.d", "snapshot-s0000000030-e000000.d"]


def test_a_directory_left_under_its_temporary_name_is_removed_at_the_next_start(store, tmp_path):
    older = saved(store, tmp_path, 10)
    leftover = tmp_path / "snapshots" / ".snapshot-s0000000020-e000000.d.tmp-1-abcdef01"
    (leftover / "shards").mkdir(parents=True)  # killed while hashing the files it moved in
    (leftover / "shards" / "part-0").write_text("half")
    restarted = SnapshotStore(tmp_path / "snapshots", keep=2)
    assert not leftover.exists() and restarted.latest() == older


def test_keep_prunes_directory_snapshots_with_their_manifests(store, tmp_path):
    for step in (10, 20, 30):
        saved(store, tmp_path, step)
    assert [info.step for info in store.complete()] == [20, 30]
    names = sorted(p.name for p in (tmp_path / "snapshots").iterdir() if p.name.startswith("snapshot-"))
    assert names == ["snapshot-s0000000020-e000000.d", "snapshot-s0000000020-e000000.json",
                     "snapshot-s0000000030-e000000.d", "snapshot-s0000000030-e000000.json"]


def test_saving_the_same_step_again_replaces_it(store, tmp_path):
    saved(store, tmp_path, 10)
    store.save_directory(checkpoint(tmp_path / "again", 10, {"model.safetensors": "second"}), epoch=0, step=10)
    info = store.latest()
    assert [name for name, _, _ in info.files] == ["model.safetensors"]
    assert open(os.path.join(info.path, "model.safetensors")).read() == "second"


def test_only_damaged_directories_is_the_unreadable_verdict(store, tmp_path):
    only = saved(store, tmp_path, 10)
    (Path(only.path) / "trainer_state.json").write_text("{'changed': 1}")
    with pytest.raises(SnapshotsUnreadableError, match="trainer_state.json: size 14 bytes does not match"):
        store.latest()


def test_a_link_in_the_checkpoint_is_refused_and_nothing_is_stored(store, tmp_path):
    source = checkpoint(tmp_path / "staging", 10)
    (source / "elsewhere").symlink_to("/etc/hostname")
    with pytest.raises(SnapshotError, match="elsewhere in checkpoint .* is a symbolic link: a snapshot holds "
                                            "regular files only"):
        store.save_directory(source, epoch=0, step=10)
    assert list((tmp_path / "snapshots").iterdir()) == []


def test_a_missing_checkpoint_is_a_clear_error(store, tmp_path):
    with pytest.raises(SnapshotError, match=f"checkpoint directory {tmp_path}/nowhere does not exist"):
        store.save_directory(tmp_path / "nowhere", epoch=0, step=10)


def test_other_ranks_store_nothing(tmp_path):
    source = checkpoint(tmp_path / "staging", 10)
    SnapshotStore(tmp_path / "snapshots", rank=1).save_directory(source, epoch=0, step=10)
    assert source.exists() and not (tmp_path / "snapshots").exists()


def test_load_of_a_directory_snapshot_says_the_framework_resumes_from_its_path(store, tmp_path):
    info = saved(store, tmp_path, 10)
    with pytest.raises(SnapshotError, match="it is a directory snapshot .* resume_from_checkpoint"):
        store.load(info)


def test_file_snapshots_keep_format_1_beside_directory_ones(store, tmp_path):
    store.save({"w": torch.ones(2)}, epoch=0, step=5)
    saved(store, tmp_path, 10)
    assert [(info.step, info.is_directory) for info in store.complete()] == [(5, False), (10, True)]
    assert json.loads(store.complete()[0].manifest_path.read_text())["format"] == 1


@pytest.mark.parametrize(("edit", "why"), [
    (lambda m: m.update(file=".."),
     "file '..' is not 'snapshot-s0000000010-e000000.d' (a manifest names its own data)"),
    (lambda m: m["files"].append({"path": "../../outside", "sha256": "0" * 64, "size": 1}),
     "files lists '../../outside': each path must be relative, inside the snapshot's directory"),
    (lambda m: m.update(files=[]), "files is empty (a directory snapshot lists every file it holds)"),
], ids=["file-is-the-parent", "a-path-climbs-out", "no-files"])
def test_a_manifest_pointing_outside_its_snapshot_is_unreadable_and_nothing_is_deleted(store, tmp_path, caplog,
                                                                                       edit, why):
    older = saved(store, tmp_path, 5)
    newer = saved(store, tmp_path, 10)
    manifest = json.loads(newer.manifest_path.read_text())
    edit(manifest)
    newer.manifest_path.write_text(json.dumps(manifest))
    assert store.latest() == older
    assert why in caplog.text
    for step in (15, 20):  # keep=2: step 10 falls out of the newest two and is pruned, if it counted
        saved(store, tmp_path, step)
    assert [info.step for info in store.complete()] == [15, 20] and newer.manifest_path.exists()
