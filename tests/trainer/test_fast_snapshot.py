"""The fast snapshot tier in one process: the shared-memory copy itself, and a resume from it
that loses only the step in flight and ends with an uninterrupted run's weights."""
import dataclasses
import logging
import os
import stat
import subprocess

import pytest
import torch

from ddpjob_trainer import SnapshotStore, Trainer, TrainerConfig, read_metrics
from ddpjob_trainer.examples.mlp import fault_injection, make_dataset, mse
from ddpjob_trainer.snapshots import fast as fast_module
from ddpjob_trainer.snapshots.fast import FastSnapshot, Room, UnsafeDirectory, fast_root, flatten, shortfall, unflatten
from ddpjob_trainer.report.metrics import read_raw_metrics

DATA = make_dataset(200, seed=3)
STEPS = 26


def state(value):
    return {"model": {"w": torch.full((300, 300), float(value)), "b": torch.arange(3.0) + value},
            "optimizer": {"param_groups": [{"lr": 0.1, "betas": (0.9, 0.99)}]}, "step": value}


def test_a_copy_round_trips_and_the_newest_complete_one_is_named_by_the_meta(tmp_path):
    fast = FastSnapshot(tmp_path / "node", local_rank=0)
    assert fast.newest() is None
    for step in (1, 2, 3):
        fast.save(state(step), step=step)
    fast.wait()
    meta = fast.newest()
    assert (meta["step"], meta["slot"]) == (3, 0)  # slots alternate 0, 1, 0
    loaded = fast.load(meta)
    torch.testing.assert_close(loaded["model"]["w"], state(3)["model"]["w"])
    assert loaded["optimizer"] == state(3)["optimizer"] and loaded["step"] == 3


def test_every_dtype_and_layout_comes_back_bit_for_bit(tmp_path):
    """Contiguous CPU tensors go by memmove, anything else by copy_: both exact."""
    generator = torch.Generator().manual_seed(5)
    big = torch.randn(400, 300, generator=generator)  # over SMALL_NUMEL: copied in the background
    saved = {"f32": big, "transposed": big.t(), "every_other": big[:, ::2], "bf16": big.to(torch.bfloat16),
             "i64": torch.randint(-2**40, 2**40, (70000,), generator=generator), "bool": big > 0,
             "step": torch.tensor(12.0), "empty": torch.empty(0, 3), "small": torch.randn(5, generator=generator)}
    fast = FastSnapshot(tmp_path / "node", local_rank=0)
    fast.save(saved, step=1)
    fast.wait()
    loaded = fast.load(fast.newest())
    for name, tensor in saved.items():
        assert loaded[name].dtype == tensor.dtype and torch.equal(loaded[name], tensor), name


def test_a_rank_that_finishes_first_removes_its_own_copies_only_and_the_last_one_the_directory(tmp_path):
    """The node's local ranks share its directory: a rank done first took the whole directory along
    while another rank's copy thread still wrote its meta (FileNotFoundError in test_example_mlp)."""
    node = tmp_path / "node"
    first, second = FastSnapshot(node, local_rank=0), FastSnapshot(node, local_rank=1)
    for fast in (first, second):
        fast.save(state(4), step=4)
        fast.wait()
    second.remove()
    assert not list(node.glob("fast-1*")) and first.newest()["step"] == 4
    first.save(state(5), step=5)  # its copy still lands: the directory is there
    first.wait()
    assert first.newest()["step"] == 5
    first.remove()
    assert not node.exists()


def test_a_restarted_writer_first_fills_the_slot_its_meta_does_not_name(tmp_path):
    first = FastSnapshot(tmp_path, 0)
    first.save(state(7), step=7)
    first.wait()
    again = FastSnapshot(tmp_path, 0)
    meta = again.newest()
    slot, _ = again._targets([(t.dtype, tuple(t.shape), t.numel() * t.element_size())
                              for t in flatten(state(8))[1]])
    assert slot == 1 - meta["slot"]
    assert again.load(meta)["model"]["w"][0, 0] == 7.0, "the complete copy was left intact"


def test_a_failed_copy_is_raised_once_by_the_next_wait_and_the_older_copy_stays(tmp_path):
    fast = FastSnapshot(tmp_path / "node", local_rank=0)
    fast.save(state(1), step=1)
    fast.wait()
    fast.save({**state(2), "unpicklable": lambda: None}, step=2)  # the same tensors, a record torch.save refuses
    with pytest.raises(RuntimeError, match=f"fast snapshot to {tmp_path / 'node'} failed: "):
        fast.wait()
    fast.wait()  # reported once
    assert fast.newest()["step"] == 1, "a copy that failed never counts"


def test_flatten_and_unflatten_are_inverse():
    skeleton, tensors = flatten(state(4))
    assert len(tensors) == 2 and unflatten(skeleton, tensors)["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.99)


def test_copies_are_kept_apart_per_job_and_node(tmp_path, monkeypatch):
    monkeypatch.setenv("DDPJOB_NODE_INDEX", "1")
    one, other = fast_root(tmp_path / "a", tmp_path), fast_root(tmp_path / "b", tmp_path)
    monkeypatch.setenv("DDPJOB_NODE_INDEX", "2")
    assert len({one, other, fast_root(tmp_path / "a", tmp_path)}) == 3 and one.name.endswith("-1")


def build():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(32, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    return model, optimizer, torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.99)


def run(env, directory, fast_root_dir, restart_count=0, fail_at_step=None, fast_every=None):
    """The Trainer on a small model; ``fast_every`` None leaves the fast tier at its default."""
    model, optimizer, scheduler = build()
    fast = {} if fast_every is None else {"fast_snapshot_every_steps": fast_every}
    config = TrainerConfig(epochs=2, batch_size=8, accumulation_steps=2, snapshot_dir=str(directory),
                           snapshot_every_steps=10, metrics_file=str(directory / "metrics.jsonl"), progress_bar=False,
                           fast_snapshot_root=str(fast_root_dir), **fast)
    trainer = Trainer(model, optimizer, DATA, config, loss_fn=mse, scheduler=scheduler,
                      env=dataclasses.replace(env, restart_count=restart_count),
                      on_step=fault_injection(0.0, fail_at_step, restart_count))
    return trainer, trainer.train()


@pytest.mark.parametrize("fail_at", [18, 13])  # mid epoch 1; the last step of epoch 0 (copied after its end)
def test_by_default_a_crash_resumes_from_shared_memory_losing_only_the_step_in_flight(env, tmp_path, fail_at):
    reference, crashed, shm = tmp_path / "reference", tmp_path / "crashed", tmp_path / "shm"
    run(env, reference, tmp_path / "shm-reference", fast_every=0)
    with pytest.raises(RuntimeError, match=f"fail_at_step={fail_at}"):
        run(env, crashed, shm, fail_at_step=fail_at)
    trainer, result = run(env, crashed, shm, restart_count=1, fail_at_step=fail_at)
    assert trainer.resumed_from.step == fail_at - 1 and result.step == STEPS  # the volume holds step 10
    raw = [e["step"] for e in read_raw_metrics(crashed / "metrics.jsonl") if e["event"] == "step"]
    assert [s for s in set(raw) if raw.count(s) > 1] == [fail_at], "only the step in flight ran twice"
    assert [e["step"] for e in read_metrics(crashed / "metrics.jsonl") if e["event"] == "step"] == list(range(1, 27))
    expected = SnapshotStore(reference).load_latest()[1]["model"]
    actual = SnapshotStore(crashed).load_latest()[1]["model"]
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=1e-6, atol=1e-7, msg=name)
    assert not any(shm.iterdir()), "a finished job removes its copies"


def test_the_tier_is_off_when_asked_and_a_crash_then_resumes_from_the_volume(env, tmp_path):
    with pytest.raises(RuntimeError, match="fail_at_step=18"):
        run(env, tmp_path / "crashed", tmp_path / "shm", fail_at_step=18, fast_every=0)
    trainer, result = run(env, tmp_path / "crashed", tmp_path / "shm", restart_count=1, fail_at_step=18, fast_every=0)
    assert trainer.fast is None and not (tmp_path / "shm").exists()
    assert trainer.resumed_from.step == 13 and result.step == STEPS  # the volume's newest: epoch 0's end


# --- the tier is on by default, so it must never be what fails a job: no room turns it off ---

MiB = 2**20


@pytest.mark.parametrize("needed, found, problem", [
    (100 * MiB, Room(free=300 * MiB), None),
    (301 * MiB, Room(free=300 * MiB), "needs 301.0 MiB and its filesystem has 300.0 MiB free"),
    (100 * MiB, Room(free=300 * MiB, memory_limit=1000 * MiB, memory_left=200 * MiB), None),
    (101 * MiB, Room(free=300 * MiB, memory_limit=1000 * MiB, memory_left=200 * MiB),
     "needs 101.0 MiB and the memory limit (1000.0 MiB) has 200.0 MiB left, of which 10% of the limit stays free"),
    (1 * MiB, Room(free=300 * MiB, memory_limit=1000 * MiB, memory_left=-5 * MiB),
     "needs 1.0 MiB and the memory limit (1000.0 MiB) has 0.0 MiB left, of which 10% of the limit stays free"),
])
def test_the_slots_must_fit_the_filesystem_and_leave_a_tenth_of_the_memory_limit(needed, found, problem):
    assert shortfall(needed, found) == problem


def big_state(step):
    """Two copies of it (2 x 1.4 MiB) do not fit in a 1 MiB tmpfs."""
    return {"model": {"w": torch.full((600, 600), float(step))}, "step": step}


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A real 1 MiB tmpfs (as a small /dev/shm is); mounting one needs root."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
                                           capture_output=True).returncode != 0:
        pytest.skip("mounting a tmpfs needs root")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def fills_nothing(fast: FastSnapshot, caplog) -> str:
    """Saves three times into ``fast``, which has no room; the one warning it logged."""
    with caplog.at_level(logging.WARNING, logger="ddpjob_trainer.snapshots.fast"):
        for step in (1, 2, 3):
            fast.save(big_state(step), step=step)
            fast.wait()
    warnings = [r.getMessage() for r in caplog.records if "fast snapshot tier off" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert fast.newest() is None and list(fast.directory.iterdir()) == [], "its files went, their memory with them"
    return warnings[0]


def test_a_tmpfs_without_room_for_the_slots_turns_the_tier_off_with_one_warning(tiny_tmpfs, caplog):
    fast = FastSnapshot(tiny_tmpfs / "node", local_rank=0, local_world_size=2)
    warning = fills_nothing(fast, caplog)
    assert warning.startswith(f"fast snapshot tier off for local rank 0: {tiny_tmpfs / 'node'}: 2 slot(s) of 1.4 MiB "
                              "for each of the node's 2 worker(s) needs 5.5 MiB and its filesystem has 1.0 MiB free; "
                              "a SIGKILL now loses the steps since the last volume snapshot")
    assert "set fast_snapshot_every_steps=0" in warning and fast.off is not None


def test_a_tmpfs_filled_after_the_check_answers_enospc_not_sigbus(tiny_tmpfs, caplog, monkeypatch):
    """Another worker may take the room between the check and the allocation: the slots are
    reserved with posix_fallocate, so the copy thread never writes into a page the tmpfs lacks."""
    monkeypatch.setattr(fast_module, "room", lambda directory: Room(free=1 << 40))
    warning = fills_nothing(FastSnapshot(tiny_tmpfs / "node", local_rank=0), caplog)
    assert f"{tiny_tmpfs / 'node'} has no room for 1.4 MiB: No space left on device" in warning


def test_without_room_training_goes_on_and_a_crash_resumes_exactly_from_the_volume(env, tmp_path, monkeypatch):
    monkeypatch.setattr(fast_module, "room", lambda directory: Room(free=4096))
    reference, crashed = tmp_path / "reference", tmp_path / "crashed"
    run(env, reference, tmp_path / "shm-reference", fast_every=0)
    with pytest.raises(RuntimeError, match="fail_at_step=18"):
        run(env, crashed, tmp_path / "shm", fail_at_step=18)
    trainer, result = run(env, crashed, tmp_path / "shm", restart_count=1, fail_at_step=18)
    assert trainer.fast.off is not None
    assert trainer.resumed_from.step == 13 and result.step == STEPS  # the volume's newest: epoch 0's end
    assert [e["step"] for e in read_metrics(crashed / "metrics.jsonl") if e["event"] == "step"] == list(range(1, 27))
    expected = SnapshotStore(reference).load_latest()[1]["model"]
    actual = SnapshotStore(crashed).load_latest()[1]["model"]
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=1e-6, atol=1e-7, msg=name)


def test_without_a_directory_to_copy_into_the_tier_is_off_and_training_goes_on(env, tmp_path, caplog):
    (tmp_path / "file").write_text("not a directory")
    with caplog.at_level(logging.WARNING, logger="ddpjob_trainer.trainer"):
        trainer, result = run(env, tmp_path / "run", tmp_path / "file" / "shm")
    assert trainer.fast is None and result.step == STEPS
    assert any(r.getMessage().startswith("fast snapshot tier off for local rank 0: cannot create ")
               for r in caplog.records)


# --- /dev/shm is shared by every user of the machine: the node's directory must be ours alone ---

OTHER_UID = 1001  # a second user of the machine


def saved(fast: FastSnapshot, step: int = 1) -> FastSnapshot:
    fast.save(state(step), step=step)
    fast.wait()
    return fast


def test_the_directory_is_created_0700_and_every_state_file_0600(tmp_path):
    fast = saved(FastSnapshot(tmp_path / "shm" / "node", local_rank=0), 1)
    saved(fast, 2)
    assert stat.S_IMODE((tmp_path / "shm" / "node").stat().st_mode) == 0o700
    files = sorted((tmp_path / "shm" / "node").iterdir())
    assert [f.name for f in files] == ["fast-0-slot0.bin", "fast-0-slot1.bin", "fast-0.meta"]
    assert {oct(stat.S_IMODE(f.stat().st_mode)) for f in files} == {oct(0o600)}


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_a_directory_another_user_created_is_refused_and_nothing_is_written_there(tmp_path):
    planted = tmp_path / "node"
    planted.mkdir(mode=0o755)
    os.chown(planted, OTHER_UID, OTHER_UID)
    with pytest.raises(UnsafeDirectory) as refused:
        saved(FastSnapshot(planted, local_rank=0))
    assert str(refused.value) == (
        f"fast snapshot directory {planted} (owner uid {OTHER_UID}, mode drwxr-xr-x) belongs to uid {OTHER_UID}: "
        f"it must be a real directory owned by uid {os.geteuid()} that no other user can write; remove it, "
        "or set DDPJOB_FAST_SNAPSHOT_ROOT to a directory of your own")
    assert refused.value.reason == "UnsafeFastSnapshotDirectory"
    assert list(planted.iterdir()) == []


def test_a_symbolic_link_in_place_of_the_directory_is_refused_and_its_target_untouched(tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    (tmp_path / "node").symlink_to(victim)
    with pytest.raises(UnsafeDirectory, match=r"node \(owner uid \d+, mode l[-rwx]+\) is a symbolic link: "):
        saved(FastSnapshot(tmp_path / "node", local_rank=0))
    assert list(victim.iterdir()) == []


def test_a_directory_others_can_write_is_refused(tmp_path):
    (tmp_path / "node").mkdir()
    os.chmod(tmp_path / "node", 0o777)
    with pytest.raises(UnsafeDirectory, match="mode drwxrwxrwx.* is writable by its group or by others: "):
        FastSnapshot(tmp_path / "node", local_rank=0)


def test_a_symbolic_link_in_place_of_a_state_file_is_replaced_never_followed(tmp_path):
    """A link left in the directory (from before it was ours alone) points at a file elsewhere:
    the save writes fresh files in the directory and the file elsewhere keeps its bytes."""
    node = tmp_path / "node"
    node.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    for name in ("fast-0-slot0.bin", "fast-0-slot1.bin", f".fast-0.meta.tmp-{os.getpid()}"):
        (node / name).symlink_to(victim)
    fast = saved(FastSnapshot(node, local_rank=0), 3)
    assert victim.read_bytes() == b"precious"
    assert not any(p.is_symlink() for p in node.iterdir())
    assert fast.load(fast.newest())["step"] == 3
