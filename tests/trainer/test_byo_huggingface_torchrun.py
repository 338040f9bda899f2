"""The Hugging Face callback with two DDP workers under real torchrun (gloo, CPU): a node killed
whole (SIGKILL of every process), then SIGTERM to one worker, and the job still ends with the
weights of an uninterrupted run, every step trained once. Slow: four torchrun launches."""
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytest.importorskip("transformers")  # the optional extra ddpjob-trainer[huggingface]

from ddpjob_sandbox.procs import kill_marked_until_gone, start_in_own_group  # noqa: E402
from ddpjob_sandbox.torchrun import BASE_ENV, MARKER_ENV  # noqa: E402
from ddpjob_rdzv.contract import SNAPSHOT_DIR_ENV  # noqa: E402
from ddpjob_trainer.report.metrics import read_metrics  # noqa: E402
from ddpjob_trainer.snapshots.store import SnapshotStore  # noqa: E402
from test_byo_huggingface import assert_same_weights, final_weights, steps  # noqa: E402

# Four torchrun launches of two workers that each import transformers: ~15 s each unloaded,
# ~55 s each at a load average of 20 (measured), hence more than the suite's 300 s.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SEQUENCES = 48  # 2 ranks x batch 4: 6 steps an epoch, 12 in all; snapshots every 4 steps
STEPS = 12

SCRIPT = '''
import os
import sys
from test_byo_huggingface import Fault, run

faults = [Fault(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:])] if len(sys.argv) > 1 else []
run(faults, sequences=int(os.environ["SEQUENCES"]))
'''


def torchrun(directory, *fault, marker=None):
    """Starts one attempt: torchrun with two workers, every process marked for kill_marked."""
    here = Path(__file__).parent
    env = {**os.environ, **BASE_ENV, SNAPSHOT_DIR_ENV: str(directory), "SEQUENCES": str(SEQUENCES),
           MARKER_ENV: marker or uuid.uuid4().hex, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(here), os.environ.get("PYTHONPATH", "")])}
    script = directory.parent / f"{directory.name}-attempt.py"
    script.write_text(SCRIPT)
    command = [str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc_per_node", "2",
               "--max_restarts", "0", str(script), *map(str, fault)]
    return start_in_own_group(command, env=env, cwd=directory.parent, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)


def finished(process, timeout=600):
    output, _ = process.communicate(timeout=timeout)
    return process.returncode, output


def test_killed_then_stopped_under_torchrun_ends_with_the_weights_of_an_uninterrupted_run(tmp_path):
    baseline, job = tmp_path / "uninterrupted", tmp_path / "job"
    baseline.mkdir(), job.mkdir()
    code, output = finished(torchrun(baseline))
    assert code == 0, output[-4000:]

    # Attempt 1: rank 0 stops at step 7 (the peer waits in the next collective); the node dies whole.
    marker, hung = uuid.uuid4().hex, tmp_path / "hung"
    attempt = torchrun(job, "hang", 7, 0, hung, marker=marker)
    deadline = time.monotonic() + 600
    while not hung.exists() and attempt.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert hung.exists(), finished(attempt)[1][-4000:]
    kill_marked_until_gone(marker, key=MARKER_ENV)
    attempt.wait(timeout=30)
    assert SnapshotStore(job).latest().step == 4

    # Attempt 2 resumes at 4; rank 1 gets SIGTERM at step 9; the vote stops both ranks at step 10.
    code, output = finished(torchrun(job, "term", 9, 1))
    assert code != 0, output[-4000:]  # rank 1 exits 143, rank 0 raises PeerStopped
    assert "stopped gracefully after step 10" in output or "exitcode  : 143" in output, output[-4000:]
    assert SnapshotStore(job).latest().step == 10
    assert [e["step"] for e in read_metrics(job / "metrics.jsonl") if e["event"] == "stop"] == [10]

    # Attempt 3 resumes at 10 and finishes.
    code, output = finished(torchrun(job))
    assert code == 0, output[-4000:]
    assert_same_weights(final_weights(job), final_weights(baseline))
    assert steps(job) == list(range(1, STEPS + 1)), "every step trained once"
    events = read_metrics(job / "metrics.jsonl")
    assert [(e["resume_step"], e["world_size"]) for e in events if e["event"] == "start"] == [
        (0, 2), (4, 2), (10, 2)]
    assert events[-1]["event"] == "done"
