"""Metrics JSON lines: one writer, and read_metrics' rollback to the effective history."""
import json
import sys

import pytest

from ddpjob_trainer.report.metrics import (MetricsWriter, TensorBoardSink, WandbSink, read_metrics, read_raw_metrics,
                                           redone_per_resume)


def write_events(path, *events):
    writer = MetricsWriter(path)
    for event in events:
        writer.write(**event)
    writer.close()


def start(resume_epoch=0, resume_step=0, restart=0):
    return {"event": "start", "world_size": 2, "restart_count": restart, "resume_epoch": resume_epoch, "resume_step": resume_step}


def step(epoch, number):
    return {"event": "step", "epoch": epoch, "step": number, "loss": 1.0 / number, "samples_per_s": 10.0, "world_size": 2}


def kinds_and_steps(events):
    return [(e["event"], e.get("step")) for e in events]


def test_every_line_is_a_json_object_with_event_and_time(tmp_path):
    path = tmp_path / "m" / "metrics.jsonl"
    write_events(path, start(), step(0, 1))
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["event"] for line in lines] == ["start", "step"]
    assert all(line["time"].endswith("Z") for line in lines)
    assert lines[1]["loss"] == 1.0 and lines[1]["world_size"] == 2


def test_a_restart_rolls_back_steps_after_the_resumed_snapshot(tmp_path):
    path = tmp_path / "metrics.jsonl"
    first = [start(), step(0, 1), step(0, 2),
             {"event": "snapshot", "epoch": 0, "step": 2, "path": "p2", "samples_consumed": 4},
             step(0, 3), step(0, 4)]                       # then the job crashed
    second = [start(resume_epoch=0, resume_step=2, restart=1), step(0, 3), step(0, 4),
              {"event": "epoch_end", "epoch": 0, "step": 4, "loss": 0.3}, {"event": "done", "epoch": 0, "step": 4}]
    write_events(path, *first)
    write_events(path, *second)  # appended: one file across restarts
    assert kinds_and_steps(read_metrics(path)) == [
        ("start", None), ("step", 1), ("step", 2), ("snapshot", 2),
        ("start", None), ("step", 3), ("step", 4), ("epoch_end", 4), ("done", 4),
    ]
    raw_steps = [e["step"] for e in read_raw_metrics(path) if e["event"] == "step"]
    assert raw_steps == [1, 2, 3, 4, 3, 4], "the raw log keeps the lost work"


def test_each_resume_names_the_steps_it_rolled_back_to_train_again(tmp_path):
    path = tmp_path / "metrics.jsonl"
    write_events(path, start(), step(0, 1), step(0, 2), step(0, 3), step(0, 4),   # killed after step 4
                 start(resume_step=2, restart=1), step(0, 3), step(0, 4), step(0, 5),  # a volume snapshot at 2
                 start(resume_step=5, restart=2), step(0, 6),                         # a copy of step 5: none lost
                 start(resume_step=5, restart=3), step(0, 6), {"event": "done", "epoch": 0, "step": 6})
    assert [(s["restart_count"], steps) for s, steps in redone_per_resume(path)] == [(1, [3, 4]), (2, []), (3, [6])]
    raw = sum(1 for e in read_raw_metrics(path) if e["event"] == "step")
    effective = sum(1 for e in read_metrics(path) if e["event"] == "step")
    assert raw - effective == 3, "the same count as raw minus effective steps"


def test_a_run_that_never_resumed_has_no_resumes(tmp_path):
    write_events(tmp_path / "metrics.jsonl", start(), step(0, 1), {"event": "done", "epoch": 0, "step": 1})
    assert redone_per_resume(tmp_path / "metrics.jsonl") == []


def test_a_restart_drops_the_end_of_an_epoch_that_runs_again_and_earlier_done_events(tmp_path):
    path = tmp_path / "metrics.jsonl"
    write_events(
        path, start(), step(0, 1), {"event": "epoch_end", "epoch": 0, "step": 1, "loss": 1.0},
        {"event": "validation", "epoch": 0, "step": 1, "loss": 1.0}, {"event": "done", "epoch": 0, "step": 1},
        # Snapshot of epoch 0 was lost; the job restarts from a snapshot at step 1 inside epoch 0.
        start(resume_epoch=0, resume_step=1, restart=1), {"event": "epoch_end", "epoch": 0, "step": 1, "loss": 1.0},
        {"event": "done", "epoch": 0, "step": 1},
    )
    assert kinds_and_steps(read_metrics(path)) == [
        ("start", None), ("step", 1), ("start", None), ("epoch_end", 1), ("done", 1),
    ]


def test_a_line_cut_by_a_crash_is_skipped(tmp_path):
    path = tmp_path / "metrics.jsonl"
    write_events(path, start(), step(0, 1))
    with open(path, "a") as handle:
        handle.write('{"event": "step", "epo')
    write_events(path, start(resume_step=1, restart=1), step(0, 2))
    assert [e.get("step") for e in read_metrics(path) if e["event"] == "step"] == [1, 2]


def test_a_writer_without_a_path_only_feeds_its_sinks(tmp_path):
    class Recorder:
        def __init__(self):
            self.events, self.closed = [], False

        def log(self, event):
            self.events.append(event["event"])

        def close(self):
            self.closed = True

    recorder = Recorder()
    writer = MetricsWriter(None, [recorder])
    writer.write("step", epoch=0, step=1, loss=1.0, samples_per_s=1.0, world_size=1)
    writer.close()
    assert recorder.events == ["step"] and recorder.closed
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("hidden", "make", "message"),
    [
        ("torch.utils.tensorboard", lambda: TensorBoardSink("/tmp/tb"),
         "tensorboard_dir is set ('/tmp/tb') but tensorboard is not installed: "
         "pip install 'ddpjob-trainer[tensorboard]'"),
        ("wandb", lambda: WandbSink("proj", None),
         "wandb_project is set ('proj') but wandb is not installed: pip install 'ddpjob-trainer[wandb]'"),
    ],
    ids=["tensorboard", "wandb"],
)
def test_optional_sinks_name_the_missing_package(monkeypatch, hidden, make, message):
    # None in sys.modules makes `import` fail as for a package that is not installed, so the
    # test holds whether or not the optional package is present here.
    monkeypatch.setitem(sys.modules, hidden, None)
    with pytest.raises(RuntimeError) as raised:
        make()
    assert str(raised.value) == message
    assert isinstance(raised.value.__cause__, ImportError)
