"""A killed local node leaves no writer behind (bench.local_run once failed removing its run dir)."""
import sys
import time
import uuid

from ddpjob_operator.local.plan import LocalNode
from ddpjob_operator.local.procs import NodeProcess, kill_marked_until_gone, marked_pids

# An "agent" that keeps forking "workers" in sessions of their own, as torchrun does; each
# worker appends to a file in the run dir until it dies. Forks keep coming during the kill.
AGENT = r"""
import os, subprocess, sys, time
out = sys.argv[1]
worker = "import os, sys, time\nwhile True:\n    open(os.path.join(sys.argv[1], f'w{os.getpid()}'), 'a').write('x')\n    time.sleep(0.005)\n"
while True:
    subprocess.Popen([sys.executable, "-c", worker, out], start_new_session=True)
    time.sleep(0.05)
"""


def test_kill_returns_only_when_no_process_of_the_node_is_left(tmp_path):
    out = tmp_path / "snapshots"
    out.mkdir()
    marker = f"test-{uuid.uuid4().hex}"
    node = NodeProcess.start(LocalNode(1, [sys.executable, "-c", AGENT, str(out)], {}), {}, tmp_path / "node.log", marker)
    deadline = time.monotonic() + 30
    while len(marked_pids(marker)) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(marked_pids(marker)) >= 4, (tmp_path / "node.log").read_text()

    node.kill()

    assert marked_pids(marker) == []
    sizes = {path.name: path.stat().st_size for path in out.iterdir()}
    time.sleep(0.3)
    assert {path.name: path.stat().st_size for path in out.iterdir()} == sizes, "something still writes"


def test_a_prefix_ends_every_incarnation_of_a_run_and_nothing_else(tmp_path):
    run = f"test-{uuid.uuid4().hex}"
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    nodes = [NodeProcess.start(LocalNode(i, sleep, {}), {}, tmp_path / f"{i}.log", marker)
             for i, marker in enumerate([f"{run}.node-0.1", f"{run}.store", f"{run}x.node-0.1"])]
    try:
        assert kill_marked_until_gone(f"{run}.", prefix=True) == []
        assert [node.process.wait(timeout=10) for node in nodes[:2]] == [-9, -9]
        assert nodes[2].poll() is None, "another run's marker merely starts the same way"
    finally:
        nodes[2].kill()
