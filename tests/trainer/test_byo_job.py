"""ddpjob_trainer.Job, the bring-your-own-loop API: atomic snapshots in $DDPJOB_SNAPSHOT_DIR, resume
position, the metrics lines `ddpjob run` follows and the progress record the operator polls.

In one process without torchrun (rank 0 of 1); tests/local/test_local_foreign.py and
tests/cluster/sandbox/test_foreign_script.py run it under real torchrun.
"""
import fractions
import json

import pytest
import torch

from ddpjob_rdzv.contract import progress_record
from ddpjob_trainer import DoNotRetry, Job
from ddpjob_rdzv.contract import SNAPSHOT_DIR_ENV
from ddpjob_trainer.job import resolve_snapshot_dir
from ddpjob_trainer.report.metrics import read_metrics
from ddpjob_rdzv.contract import TERMINATION_LOG_ENV
from ddpjob_trainer.snapshots.store import SnapshotError, SnapshotStore
from ddpjob_trainer.stop import GracefulStop, PeerStopped


def env(tmp_path, rank=0, local_rank=0, **extra):
    return {SNAPSHOT_DIR_ENV: str(tmp_path / "snapshots"), "RANK": str(rank), "LOCAL_RANK": str(local_rank),
            "WORLD_SIZE": "2", **extra}


def model_state():
    return {"model": torch.nn.Linear(3, 1).state_dict(), "note": "plain types only"}


def train(job, epochs, steps_per_epoch=4):
    for epoch in range(job.epoch, epochs):
        for _ in range(steps_per_epoch):
            job.step(loss=0.5, epoch=epoch)
        job.save(model_state(), epoch=epoch + 1)


def test_a_second_job_resumes_at_the_epoch_after_the_last_save_with_the_saved_state(tmp_path):
    with Job(environ=env(tmp_path)) as job:
        assert job.load() is None and (job.epoch, job.global_step) == (0, 0)
        train(job, epochs=2)
    with Job(environ=env(tmp_path)) as job:
        state = job.load()
        assert (job.epoch, job.global_step) == (2, 8)
        assert state["note"] == "plain types only" and set(state["model"]) == {"weight", "bias"}
        assert job.resumed_from.path.endswith("snapshot-s0000000008-e000002.pt")
        train(job, epochs=3)
    assert SnapshotStore(tmp_path / "snapshots").latest().step == 12


def test_rank_0_writes_the_metrics_ddpjob_run_follows_and_read_metrics_rolls_back_to_the_resume(tmp_path):
    with Job(environ=env(tmp_path)) as job:
        job.load()
        train(job, epochs=1)
        job.step(loss=0.25)  # trained after the last snapshot: lost when the job resumes
    with Job(environ=env(tmp_path)) as job:
        job.load()
        train(job, epochs=2)
    events = read_metrics(tmp_path / "snapshots" / "metrics.jsonl")
    assert [e["event"] for e in events].count("step") == 8, "each step once, the lost one rolled back"
    starts = [e for e in events if e["event"] == "start"]
    assert [(s["resume_epoch"], s["resume_step"], s["world_size"]) for s in starts] == [(0, 0, 2), (1, 4, 2)]
    assert [e["step"] for e in events if e["event"] == "snapshot"] == [4, 8]
    assert events[-1] == {**events[-1], "event": "done", "epoch": 1, "step": 8}


def test_other_ranks_write_no_snapshot_and_no_metrics(tmp_path):
    with Job(environ=env(tmp_path, rank=1, local_rank=1)) as job:
        job.load()
        train(job, epochs=1)
    assert not (tmp_path / "snapshots").exists() or not any((tmp_path / "snapshots").iterdir())


def test_the_node_record_reports_the_snapshot_and_a_do_not_retry(tmp_path, monkeypatch):
    message = tmp_path / "termination-log"
    message.touch()  # the kubelet creates it before the container starts
    monkeypatch.setenv(TERMINATION_LOG_ENV, str(message))
    with pytest.raises(DoNotRetry):
        with Job(environ=env(tmp_path)) as job:
            job.load()
            train(job, epochs=1)
            raise DoNotRetry("labels are missing", reason="BadDataset")
    record = progress_record.parse(message.read_bytes().rstrip())
    assert isinstance(record, progress_record.Record)
    assert (record.snapshot["epoch"], record.snapshot["step"]) == (1, 4)
    assert record.resume["fromStep"] is None and record.resume["firstStepTime"] is not None
    assert record.fatal == {"reason": "BadDataset", "message": "labels are missing"}


@pytest.mark.parametrize("stop", [GracefulStop(4), PeerStopped(4)], ids=["signalled", "peer"])
def test_a_graceful_stop_leaving_the_job_is_no_failure(tmp_path, monkeypatch, stop):
    message = tmp_path / "termination-log"
    message.touch()
    monkeypatch.setenv(TERMINATION_LOG_ENV, str(message))
    with pytest.raises(type(stop)):
        with Job(environ=env(tmp_path)) as job:
            job.load()
            train(job, epochs=1)
            raise stop
    record = progress_record.parse(message.read_bytes().rstrip())
    assert record.fatal is None and record.error is None and record.snapshot["step"] == 4


def test_the_record_is_written_where_the_pod_says(tmp_path, monkeypatch):
    message = tmp_path / "termination-log"
    message.touch()
    monkeypatch.setenv(TERMINATION_LOG_ENV, str(message))
    with Job(environ=env(tmp_path)) as job:
        job.load()
        job.step()
    assert json.loads(message.read_bytes())["resume"]["firstStepTime"] is not None


def test_a_state_a_safe_load_would_refuse_is_refused_at_the_first_save(tmp_path):
    with pytest.raises(SnapshotError, match="fractions.Fraction"):
        with Job(environ=env(tmp_path)) as job:
            job.save({"ratio": fractions.Fraction(1, 3)}, epoch=1)


def test_the_snapshot_dir_comes_from_the_environment_else_the_argument_else_an_error():
    assert resolve_snapshot_dir("mine", {SNAPSHOT_DIR_ENV: "/snapshots"}) == "/snapshots"
    assert resolve_snapshot_dir("mine", {}) == "mine"
    with pytest.raises(ValueError) as error:
        resolve_snapshot_dir(None, {})
    assert str(error.value) == ("no snapshot directory: DDPJOB_SNAPSHOT_DIR is not set (a DDPJob without "
                                "spec.snapshot, or a script started outside ddpjob); pass Job(snapshot_dir=...)")
