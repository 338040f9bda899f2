"""The run's timeline: built from the runner's events and the trainer's metrics (plain data),
drawn as a picture whose labels say what happened, and written even without matplotlib."""
import json
import struct
import sys
import xml.etree.ElementTree as ET
from datetime import datetime, timedelta, timezone

import pytest

from ddpjob_operator.local import timeline as T
from ddpjob_operator.local.journal import write_timeline
from ddpjob_operator.local.timeline import Mark, build_timeline, last_run

START = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)  # the wall time of the run clock's 0


def wall(t):
    return (START + timedelta(seconds=t)).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def event(t, kind, **fields):
    """A runner event (events.jsonl) at run-clock second t."""
    return {"time": wall(t), "t": t, "event": kind, **fields}


def metric(t, kind, **fields):
    """A trainer metrics line written at run-clock second t (it has only the wall time)."""
    return {"event": kind, "time": wall(t), **fields}


# Two nodes; node 1 killed at 10 s, replaced; the survivor resumes alone from step 20, the
# replacement joins and a whole group of two carries on from step 30.
EVENTS = [event(0.02, "started", node=0, start=1), event(0.03, "started", node=1, start=1),
          event(5.0, "phase", phase="Running"),
          event(10.0, "killed", node=1, why="--kill-node-after 5"),
          event(10.1, "exited", node=1, code=137, action="replace"), event(10.1, "phase", phase="Restarting"),
          event(12.5, "started", node=1, start=2), event(14.0, "phase", phase="Running"),
          event(20.0, "group_restart", generation=1), event(20.0, "stopped", node=0),
          event(20.0, "stopped", node=1), event(20.0, "phase", phase="Restarting"),
          event(22.0, "started", node=0, start=2), event(22.0, "started", node=1, start=3),
          event(24.0, "phase", phase="Running"),
          event(30.0, "exited", node=0, code=0, action="finished"), event(30.2, "exited", node=1, code=0),
          event(30.3, "phase", phase="Succeeded", message="training finished")]
METRICS = [metric(-50.0, "step", step=99, world_size=4),  # an earlier run in the same snapshot directory
           metric(4.0, "start", world_size=2, resume_step=0),
           *[metric(4.0 + s * 0.2, "step", step=s, world_size=2) for s in range(1, 26)],
           metric(8.0, "snapshot", step=20, epoch=1),
           metric(13.0, "start", world_size=1, resume_step=20),
           *[metric(13.0 + (s - 20) * 0.2, "step", step=s, world_size=1) for s in range(21, 31)],
           metric(15.0, "snapshot", step=30, epoch=2),
           metric(23.0, "start", world_size=2, resume_step=30),
           *[metric(23.0 + (s - 30) * 0.2, "step", step=s, world_size=2) for s in range(31, 41)]]


@pytest.fixture
def timeline():
    return build_timeline("mlp", EVENTS, METRICS)


def test_the_timeline_places_the_trainers_metrics_on_the_runners_clock(timeline):
    assert [(r.t, r.world_size, r.resume_step, len(r.steps)) for r in timeline.runs] == [
        (4.0, 2, 0, 25), (13.0, 1, 20, 10), (23.0, 2, 30, 10)]
    assert timeline.runs[1].steps[0] == (13.2, 21)
    assert timeline.snapshots == [(8.0, 20), (15.0, 30)]
    assert timeline.end == 30.3 and timeline.phase == "Succeeded"


def test_the_timeline_names_kills_failures_group_restarts_and_pauses(timeline):
    assert timeline.kills == [Mark(10.0, "kill node 1", 1)]
    assert timeline.failures == [Mark(10.1, "node 1 exit 137", 1)]  # exit 0 is no failure
    assert timeline.group_restarts == [Mark(20.0, "group restart (generation 1)")]
    assert timeline.pauses == [(10.1, 14.0), (20.0, 24.0)]
    assert timeline.nodes_running == [(0.0, 0), (0.02, 1), (0.03, 2), (10.1, 1), (12.5, 2), (20.0, 1), (20.0, 0),
                                      (22.0, 1), (22.0, 2), (30.0, 1), (30.2, 0)]


def test_a_pause_still_open_at_the_end_lasts_until_the_end():
    events = [event(0.1, "started", node=0), event(3.0, "phase", phase="Restarting"), event(9.0, "stopped", node=0)]
    assert build_timeline("mlp", events, []).pauses == [(3.0, 9.0)]


def test_a_reused_run_directory_draws_only_the_latest_run():
    earlier = [event(0.1, "started", node=0), event(50.0, "killed", node=0), event(60.0, "phase", phase="Failed",
                                                                                    message="x")]
    latest = [event(0.05, "started", node=0), event(7.0, "phase", phase="Succeeded", message="done")]
    assert last_run(earlier + latest) == latest
    assert build_timeline("mlp", earlier + latest, []).kills == []


def test_a_long_run_keeps_a_bounded_number_of_steps_and_each_runs_last(monkeypatch):
    monkeypatch.setattr(T, "MAX_STEP_POINTS", 100)
    metrics = [metric(0.0, "start", world_size=1, resume_step=0),
               *[metric(s * 0.01, "step", step=s) for s in range(1, 1001)]]
    run = build_timeline("mlp", [event(0.0, "started", node=0)], metrics).runs[0]
    assert len(run.steps) <= 101 and run.steps[-1] == (10.0, 1000)


def test_unreadable_lines_and_times_are_skipped_not_fatal():
    metrics = [metric(1.0, "step", step=1), {"event": "step", "time": "not a time", "step": 2},
               {"event": "step", "step": 3}, metric(2.0, "step", step="4")]
    events = [event(0.0, "started", node=0), {"t": "soon", "event": "killed"}, {"t": 3.0}, {"event": "killed"}]
    timeline = build_timeline("mlp", events, metrics)
    assert [r.steps for r in timeline.runs] == [[(1.0, 1)]]
    assert timeline.kills == [] and timeline.end == 3.0


def svg_texts(path):
    return [" ".join("".join(node.itertext()).split()) for node in ET.parse(path).iter("{http://www.w3.org/2000/svg}text")]


def test_the_picture_labels_what_happened_in_words(timeline, tmp_path):
    from ddpjob_operator.local.timeline_plot import draw

    texts = svg_texts(draw(timeline, tmp_path / "timeline.svg"))
    assert "ddpjob run mlp: Succeeded after 30 s; 1 kill(s), 1 failure(s), 2 resume(s), 2 snapshot(s)" in texts
    assert "kill node 1; node 1 exit 137" in texts  # a kill and its exit a tenth of a second apart: one label
    assert "group restart (generation 1)" in texts
    for label in ("training step", "snapshot", "restarting", "world size", "nodes running", "run time (s)", "step"):
        assert label in texts, label


def test_the_same_timeline_draws_the_same_svg(timeline, tmp_path):
    from ddpjob_operator.local.timeline_plot import draw

    first = draw(timeline, tmp_path / "a.svg").read_bytes()
    assert draw(timeline, tmp_path / "b.svg").read_bytes() == first


def test_the_picture_can_be_a_png(timeline, tmp_path):
    from ddpjob_operator.local.timeline_plot import draw

    data = draw(timeline, tmp_path / "timeline.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert width > height > 300


def write_run(tmp_path):
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in EVENTS))
    metrics_file = tmp_path / "snapshots" / "metrics.jsonl"
    metrics_file.parent.mkdir()
    metrics_file.write_text("".join(json.dumps(m) + "\n" for m in METRICS) + '{"event": "st')  # a line cut short
    return metrics_file


def test_the_run_directory_gets_the_picture_and_its_data(tmp_path):
    lines = write_timeline("mlp", tmp_path, write_run(tmp_path))
    assert lines == [f"timeline: {tmp_path / 'timeline.svg'} (data: timeline.json)"]
    data = json.loads((tmp_path / "timeline.json").read_text())
    assert data["kills"] == [{"t": 10.0, "label": "kill node 1", "node": 1}] and len(data["runs"]) == 3
    assert "kill node 1; node 1 exit 137" in svg_texts(tmp_path / "timeline.svg")


def test_without_matplotlib_the_data_is_written_and_one_line_says_how_to_get_the_picture(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if the [plot] extra were not installed
    lines = write_timeline("mlp", tmp_path, write_run(tmp_path))
    assert lines == [f"timeline data: {tmp_path / 'timeline.json'}; for the picture, "
                     "pip install 'ddpjob-operator[plot]'"]
    assert json.loads((tmp_path / "timeline.json").read_text())["phase"] == "Succeeded"
    assert not (tmp_path / "timeline.svg").exists()

