"""Code of your own on the real control plane: the helm-installed operator, real torchrun, a
plain-torch script shaped like the DDP tutorial's (tests/byo_scripts/tutorial_multinode.py) and
the same script adopting ddpjob_trainer.Job.

The plain script saves `snapshot.pt` relative to its working directory; the node pods work in
`<snapshot mountPath>/work/<job>` (render.launch.working_dir), so a replaced pod finds it. With
Job the script reports its steps: the status shows them and a failure after a snapshot is free.
Fast twin: tests/operator/render/test_render_workdir.py (the rendered workingDir, localized by
the sandbox node onto the claim).
"""
from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from ddpjob_operator.api import constants as C
from ddpjob_trainer.report.record import POLL_SECONDS
from ddpjob_sandbox.metrics import JobProgress, is_event
from tests.cluster.sandbox.scenarios import TEST_SECONDS, Sandbox

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(TEST_SECONDS)]

SCRIPTS = Path(__file__).resolve().parents[2] / "byo_scripts"
START_TIMEOUT = 120  # operator + 2 torchrun agents + 2 workers importing torch on 2 shared cores
SAVED = re.compile(r"Epoch (\d+) \| Training snapshot saved")


def start(sandbox: Sandbox, script: str, *, epochs: int, max_restarts: int = 5) -> tuple[JobProgress, Path]:
    """The example job (test-speed overrides, see example_job) running `script` with one save per epoch."""
    body = sandbox.body([str(epochs), "1"], rdzv_store=None)
    spec = body["spec"]
    del spec["module"]
    spec["script"] = str(SCRIPTS / script)
    spec["env"] = [{"name": "TUTORIAL_STEP_SLEEP", "value": "0.05"}]
    spec["failurePolicy"]["maxRestarts"] = max_restarts
    progress = sandbox.apply(body)
    return progress, progress.metrics_path.parent


def saved_epochs(agent, pod: str) -> list[int]:
    """The epochs the tutorial said it saved in the current container of `pod` (none before it starts)."""
    container = agent.current(pod)
    return [int(n) for n in SAVED.findall(container.log(200_000))] if container is not None else []


@pytest.mark.slow  # ~70 s: two pods training, one replaced
def test_the_plain_tutorial_script_resumes_from_its_last_save_in_a_replaced_pod(sandbox: Sandbox):
    k8s, nodes, job = sandbox.kube, sandbox.nodes, sandbox.job
    agent = nodes
    progress, claim = start(sandbox, "tutorial_multinode.py", epochs=12)
    k8s.wait_for(lambda: len(saved_epochs(agent, f"{job}-node-0") + saved_epochs(agent, f"{job}-node-1")) >= 3,
                 timeout=START_TIMEOUT, what="three saves of snapshot.pt")
    killed = agent.kill(f"{job}-node-1")
    saved = saved_epochs(agent, f"{job}-node-0") + [int(n) for n in SAVED.findall(killed.log(200_000))]
    replacement = agent.wait_for_container(f"{job}-node-1", 60, other_than=killed.uid)
    status = progress.wait_phase(C.PHASE_SUCCEEDED, 240)

    assert (claim / "work" / "snapshot.pt").is_file()  # claim: the job's own directory of it
    resumed = [int(n) for n in re.findall(r"Resuming training from snapshot at Epoch (\d+)", replacement.log(200_000))]
    # The tutorial stores the epoch it finished, so it runs that one again: never epoch 0 here.
    assert resumed and resumed[0] >= max(saved) >= 2, (resumed, saved)
    assert status["restarts"] == 1 and status.get("restartsWithProgress", 0) == 0, "no progress seen: charged"


@pytest.mark.slow  # ~70 s
def test_with_job_the_status_shows_the_step_and_a_failure_after_a_snapshot_is_free(sandbox: Sandbox):
    k8s, nodes, job = sandbox.kube, sandbox.nodes, sandbox.job
    agent = nodes
    progress, _ = start(sandbox, "tutorial_job.py", epochs=8, max_restarts=0)
    progress.wait(is_event("start", world_size=2), START_TIMEOUT, "both nodes training")
    snapshot = progress.wait(is_event("snapshot", epoch=lambda e: e >= 2), 90, "a second snapshot")
    time.sleep(POLL_SECONDS + 2)  # node 1 copies progress.json from the shared claim at most this often
    killed = agent.kill(f"{job}-node-1")
    agent.wait_for_container(f"{job}-node-1", 60, other_than=killed.uid)
    resumed = progress.wait(is_event("start", resume_epoch=lambda e: e >= snapshot["epoch"]), START_TIMEOUT,
                            "training resumed at the epoch after a save")
    status = progress.wait_phase(C.PHASE_SUCCEEDED, 240)

    assert (status["restarts"], status["restartsWithProgress"]) == (1, 1), status
    final = [e for e in progress.events() if e["event"] == "snapshot"][-1]
    assert status["lastSnapshot"]["step"] == final["step"] and status["lastSnapshot"]["epoch"] == 8
    assert resumed["resume_step"] == resumed["resume_epoch"] * 32  # 2048 samples / 2 ranks / batch 32
