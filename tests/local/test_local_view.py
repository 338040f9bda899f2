"""The view's state comes from metrics lines and runner events; the table is a pure function of it."""
import io
import json

from ddpjob_operator.local.journal import MetricsFollower
from ddpjob_operator.local.state import (
    BACKOFF, RUNNING, STARTING, SUCCEEDED, RunState, apply_metric, apply_node_event, parse_lines
)
from ddpjob_operator.local.view import LiveView, PlainView, render

START = {"event": "start", "world_size": 2, "restart_count": 0, "resume_epoch": 0, "resume_step": 0}
RESUME = {"event": "start", "world_size": 1, "restart_count": 1, "resume_epoch": 1, "resume_step": 64}


def step(n, epoch=0, world=2, loss=0.5):
    return {"event": "step", "epoch": epoch, "step": n, "loss": loss, "samples_per_s": 100.0, "world_size": world}


def test_parse_lines_keeps_an_unfinished_line_for_the_next_read():
    events, rest = parse_lines(json.dumps(START) + "\n" + '{"event": "st')
    assert events == [START] and rest == '{"event": "st'
    events, rest = parse_lines(rest + 'ep", "step": 1}\n')
    assert events == [{"event": "step", "step": 1}] and rest == ""


def test_parse_lines_skips_a_corrupt_line():
    events, _ = parse_lines('garbage\n[1]\n{"event": "done"}\n')
    assert events == [{"event": "done"}]


def fresh(replicas=2):
    state = RunState.new("mlp", replicas, max_incidents=5)
    for i in range(replicas):
        apply_node_event(state, {"event": "started", "node": i, "pid": 100 + i})
    return state


def test_state_follows_the_metrics():
    state = fresh()
    assert apply_metric(state, START) == "training started: world size 2"
    apply_metric(state, step(1))
    apply_metric(state, {"event": "snapshot", "epoch": 1, "step": 64, "path": "/x"})
    line = apply_metric(state, {"event": "epoch_end", "epoch": 0, "step": 64, "loss": 0.25})
    apply_metric(state, step(65, epoch=1, loss=0.125))
    assert line == "epoch 0 done at step 64, loss 0.2500"
    assert (state.world_size, state.epoch, state.step, state.loss) == (2, 1, 65, 0.125)
    assert state.last_snapshot_step == 64
    assert [n.state for n in state.nodes.values()] == [RUNNING, RUNNING]


def test_a_resume_counts_as_a_torchrun_restart_and_says_where_it_resumed():
    state = fresh()
    apply_metric(state, START)
    line = apply_metric(state, RESUME)
    assert line == "training resumed from the snapshot at epoch 1, step 64 (world size 1)"
    assert state.torchrun_restarts == 1 and state.world_size == 1


def test_a_restart_before_the_first_snapshot_says_it_starts_over():
    state = fresh()
    apply_metric(state, START)
    assert apply_metric(state, START) == "training restarted from step 0, no snapshot yet (world size 2)"


def test_runner_events_move_nodes_through_backoff_and_replacement():
    state = fresh()
    apply_metric(state, step(1))
    line = apply_node_event(state, {"event": "exited", "node": 1, "code": 137, "action": "replace",
                                    "message": "node 1 failed (exit code 137, SIGKILL); ...", "incidents": 1,
                                    "replace_at": 25.0})
    assert line.startswith("node 1 failed") and state.incidents == 1
    assert (state.nodes[1].state, state.nodes[1].pid, state.nodes[1].last_exit) == (BACKOFF, None, 137)
    line = apply_node_event(state, {"event": "started", "node": 1, "pid": 200})
    assert line == "node 1 started (pid 200) as a replacement"
    assert (state.nodes[1].state, state.nodes[1].starts) == (STARTING, 2)


def test_the_table_shows_nodes_world_size_progress_and_restarts():
    state = fresh()
    for event in (START, step(1), RESUME, step(65, epoch=1, world=1, loss=0.0973)):
        apply_metric(state, event)
    apply_node_event(state, {"event": "exited", "node": 1, "code": 137, "action": "replace",
                             "message": "node 1 failed (exit code 137, SIGKILL)", "incidents": 1, "replace_at": 30.0})
    apply_node_event(state, {"event": "exited", "node": 0, "code": 0, "action": "finished", "message": "m"})
    state.message = "node 1 failed (exit code 137, SIGKILL)"
    assert render(state, now=22.6) == [
        "mlp  Pending  world size 1  epoch 1  step 65  loss 0.0973",
        "torchrun restarts 1  failure incidents 1/5",
        "NODE  STATE       PID  STARTS  LAST EXIT",
        "0     succeeded   -    1       0",
        "1     backoff 7s  -    1       137",
        "last decision: node 1 failed (exit code 137, SIGKILL)",
    ]
    assert state.nodes[0].state == SUCCEEDED


def test_plain_view_prints_no_control_characters_and_a_progress_line_now_and_then():
    out = io.StringIO()
    view, state = PlainView(out), fresh()
    view.log(1.0, "node 0 started")
    view.refresh(state, 2.0)  # before the first progress interval: nothing
    view.refresh(state, 10.5)
    view.refresh(state, 11.0)  # one progress line per interval
    text = out.getvalue()
    assert "\x1b" not in text
    assert text.splitlines()[0] == "[    1.0s] node 0 started"
    # Nodes started, no step reported yet: what the runner itself knows, not "Pending".
    assert sum(line.startswith("[   10.5s] mlp  Started  nodes 2/2 up  10 s since start")
               for line in text.splitlines()) == 1
    assert len(text.splitlines()) == 2


def test_live_view_redraws_the_table_in_place_under_the_log(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    out = io.StringIO()
    view, state = LiveView(out), fresh()
    view.refresh(state, 1.0)
    height = len(render(state, 1.0))
    view.log(2.0, "node 1 killed")
    view.refresh(state, 3.0)
    text = out.getvalue()
    assert text.count(f"\x1b[{height}F\x1b[J") == 1  # the table was erased once, before the log line
    assert text.index("node 1 killed") < text.rindex("NODE  STATE")


def test_live_view_cuts_lines_to_the_terminal_width_so_the_erase_count_holds(monkeypatch):
    monkeypatch.setenv("COLUMNS", "30")
    out = io.StringIO()
    state = fresh()
    state.message = "x" * 100
    LiveView(out).refresh(state, 1.0)
    assert max(len(line) for line in out.getvalue().splitlines()) == 29


def test_the_metrics_follower_reads_only_lines_appended_since_the_run_began(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"event": "done", "step": 9}) + "\n")  # an earlier run in a reused directory
    follower = MetricsFollower(path)
    with open(path, "a") as handle:
        handle.write(json.dumps(START) + "\n" + '{"event": "step", "st')
    assert follower.new_events() == [START]
    with open(path, "a") as handle:
        handle.write('ep": 1}\n')
    assert follower.new_events() == [{"event": "step", "step": 1}]
