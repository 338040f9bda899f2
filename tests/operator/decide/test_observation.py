"""What a pass observes, when it looks again for progress, and whether a job is finished
(decide/observation.py, decide/phases.py, through reconcile): plain data and a fixed clock."""
from __future__ import annotations

import pytest

from ddpjob_operator.api import constants as C
from ddpjob_operator.decide import phases
from ddpjob_operator.decide.actions import Requeue
from ddpjob_operator.decide.isolation import FOREIGN_POLICY_RECHECK_SECONDS, observed_policy
from ddpjob_operator.decide.observation import Observation, what_to_observe
from ddpjob_operator.decide.reconcile import reconcile
from ddpjob_sandbox.jobs import make_ddpjob
from tests.operator.builders import at, make_pod, observe, running_pods

NODE_STORE = {"rdzvStore": "node"}  # no store pod to observe: the pods alone make the job Running
ALL_PHASES = (None, C.PHASE_PENDING, C.PHASE_RUNNING, C.PHASE_RESTARTING, C.PHASE_SUSPENDED, C.PHASE_SUCCEEDED,
              C.PHASE_FAILED)


@pytest.mark.parametrize("phase", ALL_PHASES)
def test_only_succeeded_and_failed_are_finished_and_only_running_and_restarting_train(phase):
    status = {"phase": phase} if phase else {}
    assert phases.finished(status) is (phase in (C.PHASE_SUCCEEDED, C.PHASE_FAILED))
    assert phases.training(status) is (phase in (C.PHASE_RUNNING, C.PHASE_RESTARTING))


@pytest.mark.parametrize("phase, poll, requeue", [
    (C.PHASE_RUNNING, 30.0, 30.0),
    (C.PHASE_RESTARTING, 5.0, 5.0),
    (C.PHASE_RUNNING, 0.0, None),  # --progress-poll-seconds 0: never
    (C.PHASE_PENDING, 30.0, None),  # nothing trains yet
    (C.PHASE_SUCCEEDED, 30.0, None),
])
def test_a_training_job_is_looked_at_again_every_poll_period(phase, poll, requeue):
    assert phases.progress_poll_requeue({"phase": phase}, poll) == requeue


@pytest.mark.parametrize("status, spec, poll, expected", [
    ({"phase": C.PHASE_RUNNING}, {}, 30.0,
     Observation(progress=True, network_policy=True, disruption_budget=True)),
    ({"phase": C.PHASE_RUNNING}, {}, 0.0, Observation(network_policy=True, disruption_budget=True)),
    ({"phase": C.PHASE_PENDING}, {"networkPolicy": {"enabled": False}}, 30.0, Observation(disruption_budget=True)),
    ({"phase": C.PHASE_SUCCEEDED}, {}, 30.0, Observation()),  # a finished job's policy and budget are left alone
    ({}, {"elasticPolicy": {"rdzvBackend": "etcd-v3", "managedEtcd": {"enabled": True}}}, 30.0,
     Observation(network_policy=True, disruption_budget=True, managed_etcd=True)),
    ({"phase": C.PHASE_FAILED}, {"elasticPolicy": {"rdzvBackend": "etcd-v3", "managedEtcd": {"enabled": True}}}, 30.0,
     Observation(managed_etcd=True)),  # its etcd pod is still deleted once the job finished
], ids=["running", "polling off", "policy off", "finished", "managed etcd", "finished with managed etcd"])
def test_what_a_pass_observes_follows_from_the_spec_and_the_previous_status(status, spec, poll, expected):
    assert what_to_observe(make_ddpjob(status=status, **spec), poll) == expected


def test_the_nodes_to_read_are_those_of_pods_past_their_deletion():
    job = make_ddpjob(replicas=2)
    pods = observe([make_pod(job, 0, deleting=True), make_pod(job, 1)]).pods
    pods = tuple(p if p.index else p.__class__(**{**p.__dict__, "node_name": "n0"}) for p in pods)
    assert Observation.nodes(pods, at(5)) == ["n0"]
    assert Observation.nodes(pods, at(0)) == []  # not past it yet


def requeues(result) -> list[float]:
    return [a.after for a in result.actions if isinstance(a, Requeue)]


def test_a_running_job_comes_back_at_the_poll_period_unless_something_is_due_sooner():
    job = make_ddpjob(replicas=2, elasticPolicy=NODE_STORE, status={"phase": C.PHASE_RUNNING})
    result = reconcile(job, observe(running_pods(job)), at(0), progress_poll=30.0)

    assert result.status["phase"] == C.PHASE_RUNNING and requeues(result) == [30.0]
    assert requeues(reconcile(job, observe(running_pods(job)), at(0), progress_poll=0.0)) == []
    deadline = make_ddpjob(replicas=2, elasticPolicy=NODE_STORE, runPolicy={"activeDeadlineSeconds": 10},
                           status={"phase": C.PHASE_RUNNING, "startTime": "2026-01-01T12:00:00Z"})
    assert requeues(reconcile(deadline, observe(running_pods(deadline)), at(0), progress_poll=30.0)) == [10.0]


def test_a_finished_job_is_not_polled():
    job = make_ddpjob(replicas=1, elasticPolicy=NODE_STORE, status={"phase": C.PHASE_RUNNING})
    result = reconcile(job, observe([make_pod(job, 0, phase="Succeeded", finished_at=at(1))]), at(2),
                       progress_poll=30.0)

    assert result.status["phase"] == C.PHASE_SUCCEEDED and 30.0 not in requeues(result)


@pytest.mark.parametrize("seconds_ago, state", [
    (None, C.POLICY_ABSENT),
    (0.0, C.POLICY_FOREIGN),
    (FOREIGN_POLICY_RECHECK_SECONDS - 1, C.POLICY_FOREIGN),
    (FOREIGN_POLICY_RECHECK_SECONDS, C.POLICY_ABSENT),  # the create is tried again
])
def test_a_name_taken_by_someone_elses_policy_is_believed_for_a_minute_after_the_409(seconds_ago, state):
    assert observed_policy(None, "uid-mlp", foreign_seconds_ago=seconds_ago).state == state


def test_an_unreadable_or_refused_policy_is_reported_as_such():
    assert observed_policy(None, "uid-mlp", readable=False).state == C.POLICY_UNREADABLE
    assert observed_policy(None, "uid-mlp", create_refused=True).state == C.POLICY_UNCREATABLE
    ours = {"metadata": {"ownerReferences": [{"controller": True, "uid": "uid-mlp"}]}, "spec": {"a": 1}}
    assert observed_policy(ours, "uid-mlp", foreign_seconds_ago=0.0).state == C.POLICY_PRESENT
