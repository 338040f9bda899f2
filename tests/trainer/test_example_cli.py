"""The example's command line: the contract's flags and defaults, and the error outside torchrun."""
import os
import subprocess
import sys
import time

import pytest

from ddpjob_trainer.examples.mlp import config_from, fault_injection, make_dataset, parse_args


def test_defaults_follow_the_contract(monkeypatch):
    monkeypatch.delenv("DDPJOB_METRICS_FILE", raising=False)
    monkeypatch.setenv("DDPJOB_SNAPSHOT_DIR", "/snapshots")
    args = parse_args(["--epochs", "5"])
    assert (args.samples, args.batch_size, args.accumulation_steps, args.seed) == (4096, 32, 1, 0)
    assert (args.snapshot_every_epochs, args.snapshot_every_steps, args.step_sleep) == (1, 0, 0.0)
    assert (args.snapshot_dir, args.metrics_file) == ("/snapshots", "/snapshots/metrics.jsonl")


def test_explicit_flags_and_the_metrics_variable_win(monkeypatch):
    monkeypatch.setenv("DDPJOB_SNAPSHOT_DIR", "/snapshots")
    monkeypatch.setenv("DDPJOB_METRICS_FILE", "/logs/m.jsonl")
    args = parse_args(["--epochs", "2", "--snapshot-dir", "/other", "--snapshot-every-steps", "7",
                       "--accumulation-steps", "4", "--step-sleep", "0.5"])
    config = config_from(args)
    assert (config.snapshot_dir, config.metrics_file) == ("/other", "/logs/m.jsonl")
    assert (config.snapshot_every_steps, config.accumulation_steps) == (7, 4)


def test_the_test_flags_are_an_on_step_hook_not_trainer_config(monkeypatch):
    """--step-sleep and --fail-at-step stay out of the public TrainerConfig."""
    slept = []
    monkeypatch.setattr(time, "sleep", slept.append)
    assert fault_injection(0.0, None, restart_count=0) is None
    hook = fault_injection(0.5, 3, restart_count=0)
    hook(2)
    assert slept == [0.5]
    with pytest.raises(RuntimeError, match="fail_at_step=3"):
        hook(3)
    fault_injection(0.0, 3, restart_count=1)(3)  # a restart passes


def test_a_smaller_group_holds_after_its_first_step_until_torchrun_stops_it(monkeypatch):
    """--wait-for-world-size: the hold ends on the stop torchrun's re-forming sends, not on a timer."""
    args = parse_args(["--epochs", "1", "--wait-for-world-size", "2"])
    assert fault_injection(0.0, None, 0, args, world_size=2) is None, "a full group never holds"
    polls, stop_after = [], 3
    monkeypatch.setattr(time, "sleep", polls.append)
    hook = fault_injection(0.0, None, 0, args, world_size=1, stopped=lambda: len(polls) >= stop_after)
    hook(7)
    assert len(polls) == stop_after, "held until stopped() said torchrun is re-forming the group"
    hook(8)
    assert len(polls) == stop_after, "only the first step of a worker holds"


def test_the_dataset_is_the_same_for_the_same_seed_and_differs_between_splits():
    first, again, validation = make_dataset(8, seed=1), make_dataset(8, seed=1), make_dataset(8, seed=1, split=1)
    assert all((a == b).all() for a, b in zip(first.tensors, again.tensors))
    assert not (first.tensors[0] == validation.tensors[0]).all()


def test_started_without_torchrun_it_names_the_missing_variable_and_the_command():
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")}
    result = subprocess.run([sys.executable, "-m", "ddpjob_trainer.examples.mlp", "--epochs", "1"],
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "environment variable RANK is not set: start this program with torchrun" in result.stderr
    assert "torchrun --standalone --nproc_per_node=2 -m ddpjob_trainer.examples.mlp --epochs 1\n" in result.stderr
