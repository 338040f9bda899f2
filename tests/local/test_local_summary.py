"""The end-of-run summary states what the metrics prove, using the trainer's own rollback."""
import json

from ddpjob_operator.local.summary import summarize


def write(tmp_path, events):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"time": "2026-01-01T00:00:00Z", **e}) + "\n" for e in events))
    return path


def start(step, epoch=0, world=2):
    return {"event": "start", "world_size": world, "restart_count": 0, "resume_epoch": epoch, "resume_step": step}


def steps(first, last, epoch=0):
    return [{"event": "step", "epoch": epoch, "step": n, "loss": 1.0, "world_size": 2} for n in range(first, last + 1)]


def test_a_resumed_run_is_exact_and_its_redone_steps_are_reported(tmp_path):
    path = write(tmp_path, [start(0), *steps(1, 5), {"event": "snapshot", "epoch": 0, "step": 3},
                            start(3, world=1), *steps(4, 6),
                            {"event": "epoch_end", "epoch": 0, "step": 6, "loss": 0.5},
                            {"event": "done", "epoch": 0, "step": 6}])
    summary = summarize(path)
    assert summary.exact and summary.resumes == 1
    assert "  resumed at epoch 0, step 3 (world size 1)" in summary.lines
    assert "  steps 1..6, each trained exactly once in the effective history: yes" in summary.lines
    assert any(line.startswith("  2 step(s) ran after the last snapshot") for line in summary.lines)


def test_a_step_logged_twice_without_a_resume_is_not_exact(tmp_path):
    path = write(tmp_path, [start(0), *steps(1, 3), *steps(3, 4), {"event": "done", "epoch": 0, "step": 4}])
    summary = summarize(path)
    assert not summary.exact
    assert "  steps 1..5, each trained exactly once in the effective history: NO" in summary.lines


def test_an_unfinished_run_says_so(tmp_path):
    summary = summarize(write(tmp_path, [start(0), *steps(1, 2)]))
    assert not summary.exact and "  training did not finish (no done event)" in summary.lines


def test_no_metrics_file_is_named(tmp_path):
    summary = summarize(tmp_path / "none.jsonl")
    assert not summary.exact and "no metrics at" in summary.lines[0]
