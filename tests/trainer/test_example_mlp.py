"""The example job under real torchrun with two CPU workers: completion, restart, world-size change.

Each test starts torchrun --standalone (one agent, gloo workers) as its own
process group and always stops the whole group.
"""
import os
import subprocess
import sys

import pytest
import torch

from ddpjob_trainer import SnapshotStore, read_metrics
from ddpjob_trainer.report.metrics import read_raw_metrics
from ddpjob_sandbox.procs import start_in_own_group, stop_process_group

EPOCHS = 3
SAMPLES = 1024
BATCH = 16
COMMON = ["--epochs", str(EPOCHS), "--samples", str(SAMPLES), "--batch-size", str(BATCH),
          "--snapshot-every-steps", "10", "--val-samples", "128", "--no-progress-bar"]


def torchrun(snapshot_dir, *args, nproc=2, max_restarts=0, timeout=180):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               f"--max-restarts={max_restarts}", "-m", "ddpjob_trainer.examples.mlp",
               "--snapshot-dir", str(snapshot_dir), *COMMON, *args]
    env = {**os.environ, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("DDPJOB_METRICS_FILE", None)
    process = start_in_own_group(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = process.communicate(timeout=timeout)
    finally:
        stop_process_group(process)
    return process.returncode, output


def step_numbers(events):
    return [e["step"] for e in events if e["event"] == "step"]


def final_weights(directory):
    info, state = SnapshotStore(directory).load_latest()
    assert info.epoch == EPOCHS and info.samples_consumed == 0
    return state["model"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    directory = tmp_path_factory.mktemp("mlp")
    code, output = torchrun(directory)
    assert code == 0, output
    return directory


def test_two_workers_train_every_step_once_and_the_loss_falls(uninterrupted):
    events = read_metrics(uninterrupted / "metrics.jsonl")
    steps_per_epoch = SAMPLES // (2 * BATCH)
    assert step_numbers(events) == list(range(1, EPOCHS * steps_per_epoch + 1))
    assert step_numbers(read_raw_metrics(uninterrupted / "metrics.jsonl")) == step_numbers(events)
    assert {e["world_size"] for e in events if e["event"] == "step"} == {2}
    epoch_losses = [e["loss"] for e in events if e["event"] == "epoch_end"]
    assert len(epoch_losses) == EPOCHS and epoch_losses == sorted(epoch_losses, reverse=True)
    first_step_loss = next(e["loss"] for e in events if e["event"] == "step")
    assert epoch_losses[-1] < first_step_loss / 10, (first_step_loss, epoch_losses)
    assert [e["event"] for e in events][0] == "start" and events[-1]["event"] == "done"
    progress = SnapshotStore(uninterrupted).latest()
    assert (progress.epoch, progress.step) == (EPOCHS, EPOCHS * steps_per_epoch)


def test_workers_restarted_by_torchrun_after_a_failure_end_with_the_same_weights(uninterrupted, tmp_path):
    code, output = torchrun(tmp_path, "--fail-at-step", "25", max_restarts=1)
    assert code == 0, output
    starts = [e for e in read_raw_metrics(tmp_path / "metrics.jsonl") if e["event"] == "start"]
    # The fast tier (on by default) holds step 24, the last one before the failing step 25: the
    # restart redoes only the step in flight, not the 4 since the volume snapshot at step 20.
    assert [(s["restart_count"], s["resume_step"]) for s in starts] == [(0, 0), (1, 24)]
    events = read_metrics(tmp_path / "metrics.jsonl")
    assert step_numbers(events) == step_numbers(read_metrics(uninterrupted / "metrics.jsonl"))
    expected, actual = final_weights(uninterrupted), final_weights(tmp_path)
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=1e-5, atol=1e-6, msg=name)


def test_a_job_resumed_with_more_workers_finishes_each_epoch_and_step_once(tmp_path):
    code, output = torchrun(tmp_path, "--fail-at-step", "40", nproc=1)
    assert code != 0
    # @record hands the failing worker's traceback to torchrun's failure report.
    assert "fail_at_step=40: failing on purpose" in output and "error_file: <N/A>" not in output
    code, output = torchrun(tmp_path, nproc=2)
    assert code == 0, output
    events = read_metrics(tmp_path / "metrics.jsonl")
    starts = [e for e in events if e["event"] == "start"]
    assert [(s["world_size"], s["resume_epoch"], s["resume_step"]) for s in starts] == [(1, 0, 0), (2, 0, 30)]
    steps = step_numbers(events)
    # 30 steps of 16 at world size 1, then (1024 - 480) // 32 = 17 steps to finish epoch 0, then 32 per epoch.
    assert steps == list(range(1, 30 + 17 + 2 * 32 + 1))
    assert [e["epoch"] for e in events if e["event"] == "epoch_end"] == [0, 1, 2]
    assert [e["event"] for e in events].count("done") == 1


def test_when_no_snapshot_can_be_read_every_worker_stops_at_once_instead_of_starting_over(uninterrupted, tmp_path):
    for info in SnapshotStore(uninterrupted).complete():
        data = bytearray(open(info.path, "rb").read())
        data[len(data) // 2] ^= 0xFF  # the sha256 no longer matches
        (tmp_path / os.path.basename(info.path)).write_bytes(bytes(data))
        (tmp_path / info.manifest_path.name).write_bytes(info.manifest_path.read_bytes())
    code, output = torchrun(tmp_path)  # a rank left waiting in a collective would hit the timeout (gloo: 10 min)
    assert code != 0
    # Rank 0 found it; rank 1 raised the same verdict rather than waiting for a snapshot name.
    assert output.count("SnapshotsUnreadableError: none of the snapshots in") >= 2, output[-4000:]
    assert not (tmp_path / "metrics.jsonl").exists(), "training started"
