"""SIGTERM in one process (world size 1, gloo): the step in flight finishes, is snapshotted, and the
resume continues at exactly the next step with the weights of an uninterrupted run.

The fast twin of the torchrun and sandbox scenarios (a node deleted gracefully): here the
worker signals itself from the on_step hook, so no process start is paid.
"""
import dataclasses
import os
import signal

import pytest
import torch

from ddpjob_trainer import SnapshotStore, Trainer, TrainerConfig, read_metrics
from ddpjob_trainer.examples.mlp import make_dataset, mse
from ddpjob_trainer.report.metrics import read_raw_metrics
from ddpjob_trainer.stop import GRACEFUL_EXIT_CODE, GracefulStop, StopSignal

DATA = make_dataset(200, seed=3)
STEPS = 26  # 2 epochs of 13 optimizer steps (25 micro-batches of 8, in twos)


def build():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(32, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    return model, optimizer, torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.99)


def sigterm_at(step_to_signal):
    def on_step(step):
        if step == step_to_signal:
            os.kill(os.getpid(), signal.SIGTERM)
    return on_step


def run(env, directory, restart_count=0, on_step=None):
    model, optimizer, scheduler = build()
    config = TrainerConfig(epochs=2, batch_size=8, accumulation_steps=2, snapshot_dir=str(directory),
                           snapshot_every_steps=10, metrics_file=str(directory / "metrics.jsonl"), progress_bar=False)
    trainer = Trainer(model, optimizer, DATA, config, loss_fn=mse, scheduler=scheduler,
                      env=dataclasses.replace(env, restart_count=restart_count), on_step=on_step)
    return trainer, trainer.train()


def weights(directory):
    return SnapshotStore(directory).load_latest()[1]["model"]


@pytest.fixture(scope="module")
def uninterrupted(env, tmp_path_factory):
    directory = tmp_path_factory.mktemp("uninterrupted")
    run(env, directory)
    return directory


@pytest.mark.parametrize("signalled_at", [5, 12])  # mid epoch 0; the last step of epoch 0 (13 stops)
def test_sigterm_snapshots_the_next_step_and_the_resume_loses_no_step(env, tmp_path, uninterrupted, signalled_at):
    with pytest.raises(GracefulStop) as stopped:
        run(env, tmp_path, on_step=sigterm_at(signalled_at))
    stop_step = signalled_at + 1  # the signal lands after step k's all-reduce: step k+1 carries it
    assert stopped.value.code == GRACEFUL_EXIT_CODE == 143 and stopped.value.step == stop_step
    assert SnapshotStore(tmp_path).complete()[-1].step == stop_step
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, "the handler is uninstalled on the way out"

    trainer, result = run(env, tmp_path, restart_count=1)
    assert trainer.resumed_from.step == stop_step and result.step == STEPS
    raw = [e["step"] for e in read_raw_metrics(tmp_path / "metrics.jsonl") if e["event"] == "step"]
    assert raw == list(range(1, STEPS + 1)), "no step trained twice"
    assert [e["step"] for e in read_metrics(tmp_path / "metrics.jsonl") if e["event"] == "stop"] == [stop_step]
    expected, actual = weights(uninterrupted), weights(tmp_path)
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=1e-6, atol=1e-7, msg=name)


def test_the_stop_signal_only_sets_a_flag_and_restores_the_previous_handler():
    previous = signal.getsignal(signal.SIGTERM)
    with StopSignal() as stop:
        assert not stop.requested
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested and stop.received == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is previous


def test_graceful_stop_says_which_step_was_saved():
    assert str(GracefulStop(7)) == "stopped gracefully after step 7 (SIGTERM); the snapshot at that step is complete"
