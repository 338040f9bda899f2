"""The training loop in one process (world size 1, gloo): resume, determinism, accumulation.

Multi-process behaviour (real torchrun, two workers, restarts) is in
test_example_mlp.py; here the loop runs in the test process so a failure and
a resume cost no process start.
"""
import dataclasses
import os

import pytest
import torch
import torch.distributed as torch_dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

from ddpjob_trainer import SnapshotStore, Trainer, TrainerConfig, read_metrics
from ddpjob_trainer.snapshots.store import SnapshotError, SnapshotsUnreadableError
from ddpjob_trainer.examples.mlp import fault_injection, make_dataset, mse
from ddpjob_trainer.report.metrics import read_raw_metrics

DATA = make_dataset(200, seed=3)


def build(seed=0, dropout=0.2):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Dropout(dropout), torch.nn.Linear(32, 4)
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.99)
    return model, optimizer, scheduler


def run(env, directory, *, restart_count=0, extra=None, fail_at_step=None, **overrides):
    """The loop resuming from the volume snapshot: the fast tier (on by default) is off unless
    ``overrides`` turn it on; its own resume is test_fast_snapshot.py's."""
    model, optimizer, scheduler = build()
    overrides = {"fast_snapshot_every_steps": 0, **overrides}
    config = TrainerConfig(
        epochs=2, batch_size=8, accumulation_steps=2, snapshot_dir=str(directory), snapshot_every_steps=4,
        metrics_file=str(directory / "metrics.jsonl"), progress_bar=False, **overrides,
    )
    trainer = Trainer(model, optimizer, DATA, config, loss_fn=mse, scheduler=scheduler,
                      env=dataclasses.replace(env, restart_count=restart_count), extra=extra,
                      on_step=fault_injection(0.0, fail_at_step, restart_count))
    return trainer, trainer.train()


def final_weights(directory):
    return SnapshotStore(directory).load_latest()[1]["model"]


@pytest.fixture(scope="module")
def uninterrupted(env, tmp_path_factory):
    directory = tmp_path_factory.mktemp("uninterrupted")
    run(env, directory)
    return directory


@pytest.fixture(scope="module")
def interrupted(env, tmp_path_factory):
    """Fails after step 18 (mid epoch 1; last snapshot at step 16), then resumes with async snapshots."""
    directory = tmp_path_factory.mktemp("interrupted")
    with pytest.raises(RuntimeError, match="fail_at_step=18: failing on purpose on the first attempt"):
        run(env, directory, fail_at_step=18, extra={"user": 1})
    trainer, result = run(env, directory, restart_count=1, fail_at_step=18, async_snapshot=True)
    return directory, trainer, result


def test_a_run_resumed_mid_epoch_ends_with_the_same_weights_as_an_uninterrupted_one(uninterrupted, interrupted):
    directory, trainer, result = interrupted
    assert (trainer.resumed_from.epoch, trainer.resumed_from.step) == (1, 16)
    assert trainer.resumed_from.samples_consumed == 3 * 2 * 8  # 3 optimizer steps of 2 micro-batches into epoch 1
    expected, actual = final_weights(uninterrupted), final_weights(directory)
    assert expected.keys() == actual.keys()
    for name in expected:
        # Dropout makes this depend on the restored RNG, Adam on the restored optimizer state.
        torch.testing.assert_close(actual[name], expected[name], rtol=1e-6, atol=1e-7, msg=name)


def test_after_a_resume_every_step_appears_once_and_the_lost_steps_are_rolled_back(interrupted):
    directory, _, result = interrupted
    steps_per_epoch = 13  # 25 micro-batches of 8, grouped in twos: 12 full groups and one single
    events = read_metrics(directory / "metrics.jsonl")
    assert [e["step"] for e in events if e["event"] == "step"] == list(range(1, 2 * steps_per_epoch + 1))
    assert [(e["epoch"], e["step"]) for e in events if e["event"] == "epoch_end"] == [(0, 13), (1, 26)]
    starts = [e for e in events if e["event"] == "start"]
    assert [(s["restart_count"], s["resume_epoch"], s["resume_step"]) for s in starts] == [(0, 0, 0), (1, 1, 16)]
    raw_steps = [e["step"] for e in read_raw_metrics(directory / "metrics.jsonl") if e["event"] == "step"]
    assert raw_steps.count(17) == raw_steps.count(18) == 2, "steps 17-18 ran, were lost, and ran again"
    assert events[-1]["event"] == "done" and result.step == 26


def test_the_users_extra_state_survives_the_restart(interrupted):
    _, trainer, result = interrupted
    assert trainer.extra == {"user": 1} and result.extra == {"user": 1}


def test_snapshots_record_the_resume_position_and_keep_two(interrupted):
    directory, _, _ = interrupted
    infos = SnapshotStore(directory).complete()
    assert [(i.epoch, i.step, i.samples_consumed) for i in infos] == [(1, 24, 176), (2, 26, 0)]
    state = SnapshotStore(directory).load(infos[-1])
    assert (state["world_size"], state["sampler_seed"], len(state["rng"])) == (1, 0, 1)
    assert state["scheduler"]["last_epoch"] == 26 and state["optimizer"]["state"][0]["step"] == 26


def test_a_finished_job_restarted_trains_nothing_more(env, uninterrupted):
    trainer, result = run(env, uninterrupted, restart_count=1)
    assert result.step == 26 and trainer.resumed_from.epoch == 2
    events = read_metrics(uninterrupted / "metrics.jsonl")
    assert [e["step"] for e in events if e["event"] == "step"] == list(range(1, 27))
    assert [e["event"] for e in events].count("done") == 1


def test_accumulating_two_micro_batches_equals_one_double_batch_and_all_reduces_once_per_step(env, tmp_path):
    results = {}
    for accumulation, batch_size in ((2, 8), (1, 16)):
        model, _, _ = build(dropout=0.0)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        config = TrainerConfig(epochs=1, batch_size=batch_size, accumulation_steps=accumulation, progress_bar=False)
        trainer = Trainer(model, optimizer, make_dataset(192, seed=1), config, loss_fn=mse, env=env)
        reductions = []

        def counting_hook(state, bucket):
            reductions.append(bucket.index())
            return allreduce_hook(state, bucket)

        trainer.ddp.register_comm_hook(None, counting_hook)
        result = trainer.train()
        results[accumulation] = (model.state_dict(), result.step, len(reductions))
    (accumulated, steps, reduced), (plain, plain_steps, _) = results[2], results[1]
    assert steps == plain_steps == 12
    assert reduced == steps, "no_sync must skip the all-reduce on all but the last micro-step"
    for name in plain:
        torch.testing.assert_close(accumulated[name], plain[name], rtol=1e-5, atol=1e-6, msg=name)


def traced_run(env, tmp_path, accumulation):
    """Trains one epoch of 200 samples in micro-batches of 8 inside a caller's bf16 autocast; returns
    each micro-batch's (loss, autocast on?) as the loss function saw them, and the logged step losses."""
    seen = []

    def traced_mse(model, batch):
        loss = mse(model, batch)
        seen.append((loss.item(), torch.is_autocast_enabled("cpu")))
        return loss

    model, optimizer, _ = build(dropout=0.0)
    config = TrainerConfig(epochs=1, batch_size=8, accumulation_steps=accumulation, progress_bar=False,
                           metrics_file=str(tmp_path / "metrics.jsonl"))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        Trainer(model, optimizer, DATA, config, loss_fn=traced_mse, env=env).train()
    logged = [e["loss"] for e in read_metrics(tmp_path / "metrics.jsonl") if e["event"] == "step"]
    return seen, logged


def test_a_steps_logged_loss_is_the_mean_of_its_micro_batches_losses(env, tmp_path):
    seen, logged = traced_run(env, tmp_path, accumulation=3)
    losses = [loss for loss, _ in seen]
    # 25 micro-batches: eight groups of three, then the epoch's last one alone.
    groups = [losses[start:start + 3] for start in range(0, len(losses), 3)]
    assert [len(group) for group in groups] == [3] * 8 + [1]
    assert logged == [sum(group) / len(group) for group in groups]  # exact: summed in float64 either way


def test_without_amp_a_callers_autocast_is_off_inside_the_loss_function(env, tmp_path):
    seen, _ = traced_run(env, tmp_path, accumulation=1)
    assert len(seen) == 25 and not any(autocast for _, autocast in seen)


def test_config_errors_name_each_field_value_and_rule():
    with pytest.raises(ValueError) as error:
        TrainerConfig(epochs=0, batch_size=-1, snapshot_every_steps=-2)
    assert str(error.value) == (
        "TrainerConfig.epochs (0) must be >= 1; TrainerConfig.batch_size (-1) must be >= 1; "
        "TrainerConfig.snapshot_every_steps (-2) must be >= 0"
    )


def test_the_trainers_snapshots_load_with_weights_only_true(uninterrupted):
    info = SnapshotStore(uninterrupted).complete()[-1]
    state = torch.load(info.path, weights_only=True)  # no allow-listed globals: plain types only
    assert (state["step"], len(state["rng"]), state["rng"][0]["numpy"]["name"]) == (26, 1, "MT19937")


def test_when_no_snapshot_can_be_read_the_trainer_refuses_to_start_over_unless_told(env, uninterrupted, tmp_path):
    for info in SnapshotStore(uninterrupted).complete():
        target = tmp_path / os.path.basename(info.path)
        data = bytearray(open(info.path, "rb").read())
        data[len(data) // 2] ^= 0xFF  # a flipped bit: the sha256 no longer matches
        target.write_bytes(bytes(data))
        target.with_suffix(".json").write_bytes(open(info.manifest_path, "rb").read())

    with pytest.raises(SnapshotsUnreadableError, match=r"none of the snapshots in .* can be read, and resuming "
                                                       r"without one would restart training from step 0"):
        run(env, tmp_path, restart_count=1)
    trainer, result = run(env, tmp_path, restart_count=1, snapshot_on_unreadable="StartOver")
    assert trainer.resumed_from is None and result.step == 26


def test_extra_state_that_weights_only_would_refuse_fails_at_the_first_snapshot(env, tmp_path):
    with pytest.raises(SnapshotError, match=r"refuses to rebuild \(builtins\.slice\)"):
        run(env, tmp_path, extra={"window": slice(0, 4)})
    assert SnapshotStore(tmp_path).complete() == []
    run(env, tmp_path / "trusted", extra={"window": slice(0, 4)}, trust_snapshots=True)
    assert SnapshotStore(tmp_path / "trusted", trusted=True).load_latest()[1]["extra"] == {"window": slice(0, 4)}


def test_the_unreadable_policy_must_be_fail_or_start_over():
    with pytest.raises(ValueError) as error:
        TrainerConfig(epochs=1, snapshot_on_unreadable="Later")
    assert str(error.value) == "TrainerConfig.snapshot_on_unreadable (Later) must be None, 'Fail' or 'StartOver'"
