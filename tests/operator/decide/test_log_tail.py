"""A failed trainer's log tail (its termination message under FallbackToLogsOnError) reaches
status.failures and Events only with failurePolicy.includeLogTail: readers of a DDPJob may not
be allowed pods/log (pure, through reconcile)."""

from __future__ import annotations

import pytest

from ddpjob_operator.api import constants as C
from ddpjob_operator.decide.reconcile import reconcile
from ddpjob_sandbox.jobs import make_ddpjob
from tests.operator.builders import at, make_pod, observe

TAIL = "connecting with DB_PASSWORD=hunter2\nTraceback (most recent call last):\nValueError: bad batch"


def failed_with_tail(job: dict) -> dict:
    pod = make_pod(job, 1, phase="Failed", exit_code=1)
    pod["status"]["containerStatuses"][0]["state"]["terminated"]["message"] = TAIL
    return pod


@pytest.mark.parametrize("include, shown", [(None, C.MSG_LOG_TAIL_HIDDEN), (False, C.MSG_LOG_TAIL_HIDDEN),
                                            (True, " ".join(TAIL.split()))])
def test_the_log_tail_is_in_status_and_events_only_when_the_job_opts_in(include, shown):
    policy = {"maxRestarts": 3} if include is None else {"maxRestarts": 3, "includeLogTail": include}
    job = make_ddpjob(replicas=2, elasticPolicy={"rdzvStore": "node"}, failurePolicy=policy)
    result = reconcile(job, observe([make_pod(job, 0), failed_with_tail(job)]), at(0))
    [failure] = result.status["failures"]
    assert failure["message"] == shown
    node_failed = [e.message for e in result.events if e.reason == C.REASON_NODE_FAILED]
    assert node_failed[0] == (f"node pod mlp-node-1 failed (exit code 1): {shown}; "
                              "1 of spec.failurePolicy.maxRestarts (3) used")
    assert ("hunter2" in str(result.status) + str(result.events)) is bool(include)


def failed_preflight_with_tail(job: dict) -> dict:
    """Node pod 1 whose pre-flight init container failed; the image printed TAIL before the check ran."""
    pod = make_pod(job, 1, phase="Pending")
    pod["status"] = {"phase": "Failed", "initContainerStatuses": [{"name": C.PREFLIGHT_CONTAINER, "state": {
        "terminated": {"exitCode": C.PREFLIGHT_EXIT_CODE, "message": TAIL + "\npreflight failed: 0 GPU(s) visible"}}}],
        "containerStatuses": [{"name": C.CONTAINER_NAME, "state": {"waiting": {"reason": "PodInitializing"}}}]}
    return pod


@pytest.mark.parametrize("include", [None, False, True])
def test_the_preflight_containers_log_tail_follows_include_log_tail_too(include):
    policy = {"maxRestarts": 3} if include is None else {"maxRestarts": 3, "includeLogTail": include}
    job = make_ddpjob(replicas=2, elasticPolicy={"rdzvStore": "node"}, failurePolicy=policy, preflight={"enabled": True})
    result = reconcile(job, observe([make_pod(job, 0), failed_preflight_with_tail(job)]), at(0))
    [failure] = result.status["failures"]
    assert failure["cause"] == C.CAUSE_PREFLIGHT
    shown = " ".join(TAIL.split()) + " preflight failed: 0 GPU(s) visible"
    assert failure["message"] == (shown if include else C.MSG_PREFLIGHT_TAIL_HIDDEN)
    assert ("hunter2" in str(result.status) + str(result.events)) is bool(include)


# The last lines torchrun or Python print when the image lacks ddpjob-trainer but the pod uses it.
NO_TRAINER_TAILS = {
    "fastRestart on c10d": "ValueError: The rendezvous backend 'ddpjob-c10d' is not registered. Did you forget "
                           "to call `register`?",
    "rdzvBackend etcd-v3": "ValueError: The rendezvous backend 'etcd-v3' is not registered. Did you forget to "
                           "call `register`?",
    "a ddpjob_trainer module": "/opt/conda/bin/python: Error while finding module specification for "
                               "'ddpjob_trainer.zygote' (ModuleNotFoundError: No module named 'ddpjob_trainer')",
}


@pytest.mark.parametrize("tail", NO_TRAINER_TAILS.values(), ids=NO_TRAINER_TAILS.keys())
def test_a_node_that_needs_ddpjob_trainer_missing_from_the_image_fails_the_job_at_once_saying_so(tail):
    """Every replacement would run the same image: failing at once, with the fix, instead of
    spending the restart budget; said without includeLogTail (the mark is torch's words, not the log)."""
    job = make_ddpjob(replicas=2, elasticPolicy={"rdzvStore": "node"}, failurePolicy={"maxRestarts": 3})
    pod = make_pod(job, 1, phase="Failed", exit_code=1)
    pod["status"]["containerStatuses"][0]["state"]["terminated"]["message"] = TAIL + "\n" + tail
    result = reconcile(job, observe([make_pod(job, 0), pod]), at(0))

    [failure] = result.status["failures"]
    assert (result.status["phase"], failure["cause"]) == (C.PHASE_FAILED, C.CAUSE_TRAINER_NOT_IN_IMAGE)
    assert result.status.get("restarts", 0) == 0
    event = next(e for e in result.events if e.reason == C.REASON_TRAINER_NOT_IN_IMAGE)
    assert event.message.startswith("node pod mlp-node-1 failed (exit code 1): ")
    assert "spec.image lacks: install it in the image (pip install ddpjob-trainer)" in event.message
    assert "hunter2" not in str(result.status) + str(result.events)


def test_a_log_tail_without_those_words_is_an_ordinary_retryable_failure():
    job = make_ddpjob(replicas=2, elasticPolicy={"rdzvStore": "node"}, failurePolicy={"maxRestarts": 3})
    result = reconcile(job, observe([make_pod(job, 0), failed_with_tail(job)]), at(0))
    [failure] = result.status["failures"]
    assert (result.status["phase"], failure["cause"]) == (C.PHASE_RESTARTING, C.CAUSE_ERROR)
