"""The fast snapshot tier in one process: the shared-memory copy itself, and a resume from it
that loses only the step in flight and ends with an uninterrupted run's weights."""
import dataclasses
import os
import stat

import pytest
import torch

from ddpjob_trainer import SnapshotStore, Trainer, TrainerConfig, read_metrics
from ddpjob_trainer.examples.mlp import fault_injection, make_dataset, mse
from ddpjob_trainer.snapshots.fast import FastSnapshot, UnsafeDirectory, fast_root, flatten, unflatten
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


def run(env, directory, fast_root_dir, restart_count=0, fail_at_step=None, fast_every=1):
    model, optimizer, scheduler = build()
    config = TrainerConfig(epochs=2, batch_size=8, accumulation_steps=2, snapshot_dir=str(directory),
                           snapshot_every_steps=10, metrics_file=str(directory / "metrics.jsonl"), progress_bar=False,
                           fast_snapshot_every_steps=fast_every, fast_snapshot_root=str(fast_root_dir))
    trainer = Trainer(model, optimizer, DATA, config, loss_fn=mse, scheduler=scheduler,
                      env=dataclasses.replace(env, restart_count=restart_count),
                      on_step=fault_injection(0.0, fail_at_step, restart_count))
    return trainer, trainer.train()


@pytest.mark.parametrize("fail_at", [18, 13])  # mid epoch 1; the last step of epoch 0 (copied after its end)
def test_a_crash_resumes_from_shared_memory_losing_only_the_step_in_flight(env, tmp_path, fail_at):
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
