"""The /proc scanner that finds a node's processes by their environment marker (also the sandbox's)."""
import os
import subprocess
import sys
import uuid

import pytest

from ddpjob_operator.local.plan import LocalNode
from ddpjob_operator.local.procs import (
    MARKER_ENV, marked_pids, marked_processes, remove_fast_tier_dirs, remove_fork_server_dirs,
)
from ddpjob_rdzv.contract.fast_tier import FAST_ROOT_ENV, fast_tier_dir

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


@pytest.fixture
def marked():
    """Starts sleepers with a fresh marker in their environment; kills them after the test."""
    started = []

    def start(env: dict[str, str]) -> subprocess.Popen:
        process = subprocess.Popen(SLEEP, env={**os.environ, **env})
        started.append(process)
        return process

    yield start
    for process in started:
        process.kill()
        process.wait()


def test_a_marked_process_is_found_with_its_parent_and_environment(marked):
    marker = uuid.uuid4().hex
    process = marked({MARKER_ENV: marker, "RANK": "3"})
    (found,) = marked_processes(marker)
    assert (found.pid, found.ppid, found.env[MARKER_ENV], found.env["RANK"]) == (process.pid, os.getpid(), marker, "3")


def test_another_key_and_a_prefix_select_what_they_name_only(marked):
    run = uuid.uuid4().hex
    node = marked({"SANDBOX_POD_UID": f"{run}.node-0"})
    store = marked({"SANDBOX_POD_UID": f"{run}.store"})
    assert marked_pids(f"{run}.node-0", key="SANDBOX_POD_UID") == [node.pid]
    assert sorted(marked_pids(f"{run}.", key="SANDBOX_POD_UID", prefix=True)) == sorted([node.pid, store.pid])
    assert marked_pids(f"{run}.", key="SANDBOX_POD_UID") == [], "without prefix the value must match whole"
    assert marked_pids(f"{run}.node-0") == [], f"the default key is {MARKER_ENV}"


def test_a_zombie_is_not_a_live_process(marked):
    marker = uuid.uuid4().hex
    process = marked({MARKER_ENV: marker})
    process.kill()
    os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)  # dead, not reaped: a zombie
    assert marked_pids(marker) == []


def test_the_fork_server_directories_of_a_finished_run_are_removed_but_not_through_a_link(tmp_path):
    ours = tmp_path / "ddpjob-zygote-run-0"
    ours.mkdir(mode=0o700)
    (ours / "socket").write_text("")  # left by a killed server
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "socket").write_text("keep")
    (tmp_path / "ddpjob-zygote-run-1").symlink_to(target)  # put there by someone else
    nodes = [LocalNode(i, ["torchrun"], {"DDPJOB_ZYGOTE_SOCKET": str(tmp_path / f"ddpjob-zygote-run-{i}" / "socket")})
             for i in (0, 1)] + [LocalNode(2, ["torchrun"], {})]
    remove_fork_server_dirs(nodes)
    assert not ours.exists()
    assert (target / "socket").read_text() == "keep"


def test_the_fast_tier_copies_a_run_left_are_removed_but_not_through_a_link_nor_another_runs(tmp_path):
    """A node killed mid-run leaves its fast-tier copies (twice the state per worker) in /dev/shm,
    memory nothing else frees; the run removes them once its processes are gone, found by the same
    rule the trainer names them with."""
    root, snapshots = tmp_path / "shm", tmp_path / "run" / "snapshots"
    root.mkdir()
    env = {"DDPJOB_SNAPSHOT_DIR": str(snapshots), FAST_ROOT_ENV: str(root)}
    ours = fast_tier_dir(snapshots, "0", root)
    ours.mkdir(mode=0o700)
    (ours / "slot-0").write_bytes(b"x" * 1024)
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "slot-0").write_text("keep")
    fast_tier_dir(snapshots, "1", root).symlink_to(target)  # put there by someone else
    other_run = fast_tier_dir(tmp_path / "other-run" / "snapshots", "0", root)
    other_run.mkdir()
    nodes = [LocalNode(i, ["torchrun"], {**env, "DDPJOB_NODE_INDEX": str(i)}) for i in (0, 1)]
    remove_fast_tier_dirs(nodes + [LocalNode(2, ["torchrun"], {})])
    assert not ours.exists()
    assert (target / "slot-0").read_text() == "keep"
    assert other_run.is_dir()
