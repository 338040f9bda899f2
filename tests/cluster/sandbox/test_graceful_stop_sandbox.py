"""Lose nothing, end to end on the real control plane (the helm-installed operator, real
torchrun, the example MLP on the kubelets' Nodes):

* a node pod deleted gracefully mid-epoch (kubectl delete pod: SIGTERM, then the grace period)
  finishes its step, snapshots it, and the job resumes at exactly the next step;
* ``kubectl scale`` down does the same: no step is trained twice;
* a node SIGKILLed with the fast snapshot tier on trains at most one step twice.

Slow (each ~1 min on two shared cores); their in-process twins are
tests/trainer/test_trainer_graceful_stop.py and tests/trainer/test_fast_snapshot.py.
Node 1 is the victim: it does not host the c10d store.
"""
from __future__ import annotations

import pytest

from ddpjob_operator.api import constants as C
from ddpjob_sandbox.examples import trainer_args
from ddpjob_sandbox.metrics import is_event
from tests.cluster.sandbox.scenarios import TEST_SECONDS, Sandbox
from tests.support.elastic_checks import assert_ran_exactly_once, steps_redone, world_size_phases

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(TEST_SECONDS)]

START_TIMEOUT = 120
VICTIM = "node-1"  # the victim pod of the test's job: <job>-node-1
EPOCHS = 2


def start(sandbox: Sandbox, *extra):
    # Volume snapshots only at epoch ends: whatever a stop keeps, the stop itself saved.
    args = trainer_args(epochs=EPOCHS, samples=1024, step_sleep=0.1, snapshot_every_steps=1000, extra=extra)
    progress, _ = sandbox.start_job(args=args)
    progress.wait(is_event("step", step=5, world_size=2), START_TIMEOUT, "both nodes training")
    return progress


@pytest.mark.slow
def test_a_node_pod_deleted_gracefully_mid_epoch_resumes_at_exactly_the_next_step(sandbox: Sandbox):
    k8s, nodes, job = sandbox.kube, sandbox.nodes, sandbox.job
    progress = start(sandbox)
    deleted = nodes.current(f"{job}-{VICTIM}")
    k8s.delete("pods", f"{job}-{VICTIM}")
    stop = progress.wait(is_event("stop"), 60, "the graceful stop")
    resumed = progress.wait(is_event("start", resume_step=stop["step"]), START_TIMEOUT, "the resume at the stop")
    progress.wait_phase(C.PHASE_SUCCEEDED, 180)

    raw = assert_ran_exactly_once(progress.metrics_path, EPOCHS)
    assert steps_redone(raw) == [], "a graceful deletion loses no step"
    assert 0 < stop["step"] < 16 and resumed["resume_step"] == stop["step"]  # mid epoch 0 (16 steps at world 2)
    assert deleted.exit_code is not None


@pytest.mark.slow
def test_kubectl_scale_down_loses_no_step(sandbox: Sandbox):
    k8s, nodes, job = sandbox.kube, sandbox.nodes, sandbox.job
    progress = start(sandbox)
    k8s.kubectl("scale", f"ddpjob/{job}", "--replicas=1")
    stop = progress.wait(is_event("stop"), 60, "the graceful stop of node 1")
    progress.wait(is_event("start", world_size=1, resume_step=stop["step"]), START_TIMEOUT, "training on alone")
    status = progress.wait_phase(C.PHASE_SUCCEEDED, 240)

    raw = assert_ran_exactly_once(progress.metrics_path, EPOCHS)
    assert steps_redone(raw) == [] and world_size_phases(raw) == [2, 1], world_size_phases(raw)
    assert status["restarts"] == 0, "a scale-down is no failure"


@pytest.mark.slow
def test_a_node_sigkilled_with_the_fast_tier_loses_at_most_one_step(sandbox: Sandbox):
    k8s, nodes, job = sandbox.kube, sandbox.nodes, sandbox.job
    progress = start(sandbox, "--fast-snapshot-every-steps", "1")
    killed = nodes.kill(f"{job}-{VICTIM}")
    resumed = progress.wait(is_event("start", resume_step=lambda s: s > 0), START_TIMEOUT, "the resume")
    progress.wait_phase(C.PHASE_SUCCEEDED, 240)

    raw = assert_ran_exactly_once(progress.metrics_path, EPOCHS)
    assert len(steps_redone(raw)) <= 1, f"steps trained twice: {steps_redone(raw)}"
    assert resumed["resume_step"] < 16, "resumed mid epoch 0, from memory: no volume snapshot came before"
    assert killed.exit_code == 137
