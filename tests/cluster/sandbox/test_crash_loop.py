"""A crash loop end to end on the real control plane: real torchrun and real training that fails at the
same step after every restart; the real operator stops it by progress, not by the budget.

How the loop is made: the example's ``--fail-at-step 15`` raises on every rank when global
step 15 finishes, but only on a first attempt (``TORCHELASTIC_RESTART_COUNT`` 0). With
``elasticPolicy.maxRestarts: 0`` torchrun does not restart its workers in the pod, so each
failure ends the pod; each replacement pod is a fresh torchrun (restart count 0 again) that
resumes from the snapshot at step 10 and fails at step 15 again. Nothing in the node agent
is needed for that.

Test-speed overrides as in test_c10d.py (see ddpjob_sandbox.examples.example_job).
"""
from __future__ import annotations

import pytest

from ddpjob_operator.api import constants as C
from ddpjob_sandbox.readers import condition, events, wait_for_event
from tests.cluster.sandbox.scenarios import TEST_SECONDS, Sandbox
from ddpjob_sandbox.examples import trainer_args
from ddpjob_sandbox.metrics import is_event

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(TEST_SECONDS)]

START_TIMEOUT = 120  # operator + 2 torchrun agents + 2 workers importing torch on 2 shared cores
FAIL_AT, SNAPSHOT_EVERY = 15, 10


@pytest.mark.slow  # ~50 s alone: three generations of pods, each importing torch
def test_a_crash_loop_at_the_same_step_fails_the_job_with_no_progress_naming_the_step(sandbox: Sandbox):
    k8s, nodes, job = sandbox.kube, sandbox.nodes, sandbox.job
    without_progress = 1

    def crash_loop_policy(spec: dict) -> None:
        spec["elasticPolicy"]["maxRestarts"] = 0  # each failure ends the pod (a fresh torchrun fails again)
        spec["failurePolicy"].update(maxRestarts=5, maxRestartsWithoutProgress=without_progress)

    args = trainer_args(epochs=2, samples=2048, step_sleep=0.1, snapshot_every_steps=SNAPSHOT_EVERY,
                        extra=("--fail-at-step", str(FAIL_AT)))
    progress, _ = sandbox.start_job(args=args, edit=crash_loop_policy)
    progress.wait(is_event("step", step=FAIL_AT), START_TIMEOUT, "the first run reaching the failing step")
    for attempt in (1, 2):  # the first failure followed a new snapshot (free); the next ones did not
        progress.wait(is_event("start", resume_step=SNAPSHOT_EVERY), START_TIMEOUT, f"restart {attempt}")
        progress.wait(is_event("step", step=FAIL_AT), 60, f"restart {attempt} reaching the failing step")
    status = progress.wait_phase(C.PHASE_FAILED, 60)

    failed = condition(k8s, C.COND_FAILED, job)
    assert failed["status"] == "True" and failed["reason"] == C.REASON_NO_PROGRESS, failed
    assert failed["message"].startswith(
        f"{without_progress + 1} failure incidents in a row without a newer snapshot (still at step {SNAPSHOT_EVERY}, "
        f"epoch 0) exceed spec.failurePolicy.maxRestartsWithoutProgress ({without_progress}); last: "), failed
    assert f"fail_at_step={FAIL_AT}" in failed["message"], failed["message"]  # the trainer's error, from the pod
    assert wait_for_event(k8s, C.REASON_NO_PROGRESS, 10, job) == \
        (C.EVENT_WARNING, C.REASON_NO_PROGRESS, failed["message"])
    assert status["restartsWithoutProgress"] == without_progress + 1, status
    assert status["lastSnapshot"]["step"] == SNAPSHOT_EVERY, status
    raw = progress.events()
    # Three runs at least (a late replacement may make one more start), every restart from the
    # snapshot at step 10, none past the failing step.
    starts = [e["resume_step"] for e in raw if e["event"] == "start"]
    assert len(starts) >= 3 and starts[0] == 0 and set(starts[1:]) == {SNAPSHOT_EVERY}, starts
    assert max(e["step"] for e in raw if e["event"] == "step") == FAIL_AT
    assert not [e for e in raw if e["event"] == "done"]
    assert not [e for e in events(k8s, job) if e[1] == C.REASON_RESTARTS_EXHAUSTED], \
        "the budget, not progress, ended it"
    k8s.wait_for(lambda: all(c.exit_code is not None for c in nodes.all()), timeout=30,
                 what="every node process gone")
