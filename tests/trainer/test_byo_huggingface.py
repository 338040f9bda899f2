"""ddpjob_trainer.integrations.huggingface on a tiny GPT-2 built here (nothing downloaded): HF's
checkpoints become verified directory snapshots; a run SIGKILLed mid-training, or mid-save of a
checkpoint, resumes to the weights of an uninterrupted run with every step trained once; SIGTERM
saves the step and exits 143. One process here; two DDP workers under torchrun in
test_byo_huggingface_torchrun.py (slow)."""
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")  # the optional extra ddpjob-trainer[huggingface]

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from ddpjob_trainer.integrations.huggingface import CheckpointSetupError, DDPJobCallback  # noqa: E402
from ddpjob_rdzv.contract import SNAPSHOT_DIR_ENV  # noqa: E402
from ddpjob_trainer.report.metrics import read_metrics, read_raw_metrics  # noqa: E402
from ddpjob_trainer.snapshots.store import SnapshotStore  # noqa: E402
from ddpjob_trainer.stop import GRACEFUL_EXIT_CODE, GracefulStop  # noqa: E402

SEQUENCES, BATCH, EPOCHS, SAVE_STEPS = 24, 4, 2, 4
STEPS = EPOCHS * SEQUENCES // BATCH  # 12 in one process: snapshots at 4, 8 and 12 (mid epoch 0, mid epoch 1, end)


def tiny_model():
    """GPT-2 with one layer of width 8 and its default dropout (so each rank's RNG state matters)."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=16, n_positions=8, n_embd=8, n_layer=1, n_head=2)
    return transformers.GPT2LMHeadModel(config)


def dataset(sequences=SEQUENCES):
    tokens = torch.randint(0, 16, (sequences, 6), generator=torch.Generator().manual_seed(1))
    return [{"input_ids": row, "labels": row} for row in tokens]


class Fault(transformers.TrainerCallback):
    """At step ``at``, on ``rank`` (None: every rank): ``kill`` SIGKILLs this process's group;
    ``term`` sends SIGTERM to this process; ``hang`` writes the file ``mark`` and waits to be killed."""

    def __init__(self, action, at, rank=None, mark=None):
        self.action, self.at, self.rank, self.mark = action, at, rank, mark

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step != self.at or self.rank not in (None, int(os.environ.get("RANK", "0"))):
            return
        if self.action == "kill":
            os.killpg(os.getpgid(0), signal.SIGKILL)
        elif self.action == "term":
            os.kill(os.getpid(), signal.SIGTERM)
        elif self.action == "hang":
            Path(self.mark).write_text(str(state.global_step))
            signal.pause()


def run(faults=(), sequences=SEQUENCES, epochs=EPOCHS, save_strategy="steps"):
    """One attempt of the job in $DDPJOB_SNAPSHOT_DIR, as a training script runs it (under torchrun:
    each rank)."""
    torch.set_num_threads(1)  # a model this small only loses to threads waiting for each other
    ddpjob = DDPJobCallback()
    args = transformers.TrainingArguments(
        output_dir=ddpjob.staging_dir, per_device_train_batch_size=BATCH, num_train_epochs=epochs,
        save_strategy=save_strategy, save_steps=SAVE_STEPS, learning_rate=5e-2, seed=0, use_cpu=True,
        report_to="none", logging_strategy="no", disable_tqdm=True)
    # The fault runs before ddpjob's own step handling: a SIGTERM is seen at the same step.
    trainer = transformers.Trainer(model=tiny_model(), args=args, train_dataset=dataset(sequences),
                                   callbacks=[*faults, ddpjob])
    ddpjob.train(trainer)
    return ddpjob


def final_weights(directory):
    return load_file(os.path.join(SnapshotStore(directory).latest().path, "model.safetensors"))


def assert_same_weights(actual, expected):
    assert actual.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=0, atol=0, msg=name)


def steps(directory, raw=False):
    events = (read_raw_metrics if raw else read_metrics)(Path(directory) / "metrics.jsonl")
    return [e["step"] for e in events if e["event"] == "step"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    directory = tmp_path_factory.mktemp("uninterrupted")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(SNAPSHOT_DIR_ENV, str(directory))
        run()
    return final_weights(directory)


SCRIPT = '''
import os, signal, sys
from test_byo_huggingface import Fault, run
from ddpjob_trainer.snapshots import store as snapshot

action, at = sys.argv[1], int(sys.argv[2])
if action == "kill-before-manifest":  # the checkpoint's directory is in place, its manifest not yet
    complete = snapshot.SnapshotStore._complete

    def killed_before_manifest(store, info, version):
        if info.step == at:
            os.killpg(os.getpgid(0), signal.SIGKILL)
        complete(store, info, version)

    snapshot.SnapshotStore._complete = killed_before_manifest
    run()
else:
    run([Fault(action, at)])
'''


def script_env(directory):
    here = str(Path(__file__).parent)
    return {**os.environ, SNAPSHOT_DIR_ENV: str(directory), "PYTHONPATH": os.pathsep.join(
        [here, os.environ.get("PYTHONPATH", "")])}


@pytest.mark.parametrize(("action", "at", "reported", "resumed_at"), [
    # The snapshot at 8 torn: its directory in place, its manifest not yet; 4 steps after the one at 4.
    ("kill-before-manifest", 8, 8, 4),
    # Mid epoch 1 (6 steps an epoch), no save in flight; the fault runs before the step is reported.
    pytest.param("kill", 7, 6, 4, marks=pytest.mark.slow),  # a second process start (~15 s, a minute loaded)
])
def test_a_process_group_killed_resumes_to_the_weights_of_an_uninterrupted_run(
        tmp_path, monkeypatch, uninterrupted, action, at, reported, resumed_at):
    (tmp_path / "attempt.py").write_text(SCRIPT)
    killed = subprocess.run([sys.executable, str(tmp_path / "attempt.py"), action, str(at)], env=script_env(tmp_path),
                            cwd=tmp_path, start_new_session=True, capture_output=True, text=True, timeout=240)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert SnapshotStore(tmp_path).latest().step == resumed_at, "the torn checkpoint is not chosen"

    monkeypatch.setenv(SNAPSHOT_DIR_ENV, str(tmp_path))
    resumed = run()
    assert resumed.job.resumed_from.step == resumed_at
    assert_same_weights(final_weights(tmp_path), uninterrupted)
    assert steps(tmp_path, raw=True) == [*range(1, reported + 1), *range(resumed_at + 1, STEPS + 1)]
    assert steps(tmp_path) == list(range(1, STEPS + 1)), "every step trained once"
    assert [info.step for info in SnapshotStore(tmp_path).complete()] == [8, 12]
    assert not (tmp_path / ".hf-staging").exists() or not any((tmp_path / ".hf-staging").iterdir())


def test_sigterm_saves_the_step_and_exits_143_and_the_resume_loses_nothing(tmp_path, monkeypatch, uninterrupted):
    monkeypatch.setenv(SNAPSHOT_DIR_ENV, str(tmp_path))
    with pytest.raises(GracefulStop) as stopped:
        run([Fault("term", 6)])  # the last step of epoch 0; no save is due there (every 4)
    assert stopped.value.code == GRACEFUL_EXIT_CODE == 143 and stopped.value.step == 6
    assert SnapshotStore(tmp_path).latest().step == 6
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, "the handler is uninstalled on the way out"
    assert [e["step"] for e in read_metrics(tmp_path / "metrics.jsonl") if e["event"] == "stop"] == [6]

    resumed = run()
    assert (resumed.job.resumed_from.step, resumed.job.resumed_from.epoch) == (6, 1)
    assert steps(tmp_path, raw=True) == list(range(1, STEPS + 1)), "no step trained twice"
    assert_same_weights(final_weights(tmp_path), uninterrupted)
    events = read_metrics(tmp_path / "metrics.jsonl")
    assert [(e["resume_epoch"], e["resume_step"]) for e in events if e["event"] == "start"] == [(0, 0), (1, 6)]
    assert events[-1]["event"] == "done"


def test_epoch_saves_resume_at_the_next_epoch(tmp_path, monkeypatch):
    monkeypatch.setenv(SNAPSHOT_DIR_ENV, str(tmp_path))
    run(epochs=1, save_strategy="epoch")
    latest = SnapshotStore(tmp_path).latest()
    assert (latest.epoch, latest.step) == (1, 6)
    resumed = run(epochs=2, save_strategy="epoch")
    assert resumed.job.resumed_from == latest
    assert [(info.epoch, info.step) for info in SnapshotStore(tmp_path).complete()] == [(1, 6), (2, 12)]
    assert steps(tmp_path, raw=True) == list(range(1, STEPS + 1))


@pytest.mark.parametrize(("setting", "message"), [
    ({"save_only_model": True},
     "TrainingArguments.save_only_model (True) must be False (a resume needs the optimizer and RNG states)"),
    ({"save_strategy": "no"},
     "TrainingArguments.save_strategy ('no') must be 'steps' or 'epoch' (snapshots are HF's checkpoints)"),
], ids=["save_only_model", "save_strategy"])
def test_settings_that_cannot_resume_exactly_fail_at_the_start_naming_the_field(tmp_path, monkeypatch, setting,
                                                                                 message):
    monkeypatch.setenv(SNAPSHOT_DIR_ENV, str(tmp_path))
    ddpjob = DDPJobCallback()
    args = transformers.TrainingArguments(output_dir=ddpjob.staging_dir, use_cpu=True, report_to="none",
                                          disable_tqdm=True, **setting)
    trainer = transformers.Trainer(model=tiny_model(), args=args, train_dataset=dataset(), callbacks=[ddpjob])
    with pytest.raises(CheckpointSetupError) as failed:
        ddpjob.train(trainer)
    assert str(failed.value) == message and failed.value.reason == "InvalidCheckpointSetup"
    assert steps(tmp_path) == []
