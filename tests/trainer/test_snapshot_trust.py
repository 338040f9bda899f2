"""Snapshots load with torch.load(weights_only=True): a planted pickle runs no code, old snapshots fail clearly.

Anyone who can write the shared snapshot volume can put a file there; with
weights_only=False every rank would run whatever that file's pickle says on the
next resume. These tests plant such a file (a pickle whose loading creates a
marker file), written through a trusted store so that its manifest and sha256
are right, and check that the default load refuses it without running it.
"""
import logging
import random

import numpy as np
import pytest
import torch

from ddpjob_trainer.env import snapshot_on_unreadable, trust_snapshots
from ddpjob_trainer.snapshots.store import SnapshotError, SnapshotsUnreadableError, SnapshotStore, snapshot_stem
from ddpjob_trainer.loop.rng import rng_state, set_rng_state


class CreatesFile:
    """Unpickling this calls open(path, "w"): code that runs on load, as an attacker's payload would."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def trainer_like_state(step: int) -> dict:
    """What Trainer._snapshot stores: model, Adam and scheduler state, RNG states, sampler position, extra."""
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.9)
    model(torch.ones(3, 4)).sum().backward()
    optimizer.step()
    scheduler.step()
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
            "scaler": torch.amp.GradScaler("cpu").state_dict(), "epoch": 0, "step": step, "samples_consumed": 8,
            "sampler_seed": 0, "world_size": 2, "rng": [rng_state(), rng_state()], "extra": {"wandb_run_id": "x1"}}


def test_the_trainers_state_loads_with_weights_only_true(tmp_path):
    SnapshotStore(tmp_path).save(trainer_like_state(3), epoch=0, step=3)
    state = torch.load(tmp_path / f"{snapshot_stem(0, 3)}.pt", weights_only=True)
    assert state["step"] == 3 and state["extra"] == {"wandb_run_id": "x1"}
    assert state["optimizer"]["state"][0]["step"] == 1 and state["scheduler"]["last_epoch"] == 1
    assert state["rng"][0]["numpy"]["name"] == "MT19937" and len(state["rng"][0]["numpy"]["keys"]) == 624


def test_a_pickle_that_runs_code_is_not_run_by_the_default_load_and_the_error_says_why(tmp_path):
    marker = tmp_path / "code-ran"
    SnapshotStore(tmp_path, trusted=True).save({"extra": {"x": CreatesFile(marker)}}, epoch=0, step=1)
    path = tmp_path / f"{snapshot_stem(0, 1)}.pt"

    with pytest.raises(SnapshotsUnreadableError) as raised:
        SnapshotStore(tmp_path).load_latest()
    assert not marker.exists(), "the default load ran the pickle's code"
    assert (f"  {path}: torch.load(weights_only=True) refused it (Unsupported global: GLOBAL io.open): it holds "
            f"Python objects other than tensors and plain containers, as snapshots written before ddpjob stored "
            f"its RNG states as tensors do; DDPJOB_TRUST_SNAPSHOTS=1 loads it with weights_only=False, which runs "
            f"any code it holds\n") in str(raised.value)

    SnapshotStore(tmp_path, trusted=True).load_latest()
    assert marker.exists(), "the planted pickle does run code when trusted: the refusal above is what stopped it"


def test_a_planted_newest_snapshot_is_skipped_for_the_previous_good_one(tmp_path, caplog):
    SnapshotStore(tmp_path).save({"step": 1}, epoch=0, step=1)
    marker = tmp_path / "code-ran"
    SnapshotStore(tmp_path, trusted=True).save({"step": 2, "x": CreatesFile(marker)}, epoch=0, step=2)
    with caplog.at_level(logging.WARNING):
        info, state = SnapshotStore(tmp_path).load_latest()
    assert (info.step, state, marker.exists()) == (1, {"step": 1}, False)
    assert "refused it (Unsupported global: GLOBAL io.open)" in caplog.text


def test_a_state_that_weights_only_would_refuse_is_not_saved_and_the_previous_snapshot_stays(tmp_path):
    store = SnapshotStore(tmp_path)
    store.save({"step": 1}, epoch=0, step=1)
    with pytest.raises(SnapshotError) as raised:
        store.save({"step": 2, "extra": {"table": np.arange(3)}}, epoch=0, step=2)
    assert str(raised.value) == (
        "the snapshot state holds objects that torch.load(weights_only=True) refuses to rebuild "
        "(numpy._core.multiarray._reconstruct, numpy.dtype, numpy.ndarray), so it could not be resumed from: keep "
        "the state (the Trainer's extra dict included) to tensors, numbers, strings, None and lists/tuples/dicts "
        "of them, or, if every writer of the snapshot directory is trusted, set DDPJOB_TRUST_SNAPSHOTS=1")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["progress.json", f"{snapshot_stem(0, 1)}.pt", f"{snapshot_stem(0, 1)}.json"]), "no temporary file left"
    assert store.load_latest()[0].step == 1


def old_format_state() -> dict:
    """A snapshot as ddpjob wrote it before: numpy's RNG state as numpy's own tuple (holds an ndarray)."""
    return {"rng": [{"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
                     "cuda": None}], "step": 5}


def test_an_old_snapshot_fails_clearly_and_loads_and_resumes_its_rng_once_trusted(tmp_path, monkeypatch):
    np.random.seed(11)
    SnapshotStore(tmp_path, trusted=True).save(old_format_state(), epoch=0, step=5)
    expected = np.random.rand(3).tolist()

    with pytest.raises(SnapshotsUnreadableError, match=r"refused it \(Unsupported global: GLOBAL "
                                                       r"numpy\._core\.multiarray\._reconstruct\)"):
        SnapshotStore(tmp_path).load_latest()

    monkeypatch.setenv("DDPJOB_TRUST_SNAPSHOTS", "1")
    info, state = SnapshotStore(tmp_path).load_latest()
    set_rng_state(state["rng"][0])
    assert info.step == 5 and np.random.rand(3).tolist() == expected


@pytest.mark.parametrize(("raw", "trusted"), [("1", True), ("true", True), ("0", False), ("", False)])
def test_the_trust_flag_reads_1_or_0(raw, trusted):
    assert trust_snapshots({"DDPJOB_TRUST_SNAPSHOTS": raw}) is trusted
    assert trust_snapshots({}) is False


def test_bad_snapshot_settings_name_the_variable_the_value_and_the_rule():
    with pytest.raises(ValueError) as raised:
        trust_snapshots({"DDPJOB_TRUST_SNAPSHOTS": "yes"})
    assert str(raised.value) == ("environment variable DDPJOB_TRUST_SNAPSHOTS='yes' must be 1 or 0 "
                                 "(1 loads snapshots with torch.load(weights_only=False))")
    with pytest.raises(ValueError) as raised:
        snapshot_on_unreadable({"DDPJOB_SNAPSHOT_ON_UNREADABLE": "Retry"})
    assert str(raised.value) == ("environment variable DDPJOB_SNAPSHOT_ON_UNREADABLE='Retry' must be one of "
                                 "Fail, StartOver (spec.snapshot.onUnreadable)")
    assert snapshot_on_unreadable({}) == "Fail"
    with pytest.raises(ValueError, match=r"SnapshotStore on_unreadable \('Later'\) must be one of Fail, StartOver"):
        SnapshotStore("/nonexistent", rank=1, on_unreadable="Later")
