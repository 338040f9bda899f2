"""Failure policy: outcome of a finished node, restart budget, exponential backoff."""

from __future__ import annotations

import pytest

from ddpjob_operator.api import constants as C

from ddpjob_operator.decide.failure import Outcome, classify, classify_pod
from ddpjob_operator.decide.budget import starts_new_incident
from ddpjob_operator.decide.observed import claimed, view_pod, view_pods
from ddpjob_operator.decide.budget import backoff_seconds, budget_exhausted
from tests.operator.builders import at, make_pod
from ddpjob_sandbox.jobs import make_ddpjob

PERMANENT = (126, 127)

CASES = [
    # (exit code, reason, disrupted, outcome)
    (0, None, False, Outcome.SUCCEEDED),
    (1, None, False, Outcome.RETRYABLE),
    (137, "OOMKilled", False, Outcome.RETRYABLE),
    (127, None, False, Outcome.PERMANENT),
    (126, None, False, Outcome.PERMANENT),
    (None, "Evicted", False, Outcome.DISRUPTION),
    (143, None, True, Outcome.DISRUPTION),
    (127, None, True, Outcome.DISRUPTION),  # a preempted pod says nothing about the code
    (None, None, False, Outcome.RETRYABLE),
]


@pytest.mark.parametrize("code,reason,disrupted,outcome", CASES)
def test_classify_a_finished_node(code, reason, disrupted, outcome):
    assert classify(code, reason, disrupted=disrupted, permanent_exit_codes=PERMANENT) == outcome


def test_exit_codes_are_permanent_only_when_listed():
    assert classify(127) == Outcome.RETRYABLE


@pytest.mark.parametrize("restarts,delay", [(0, 0), (1, 10), (2, 20), (3, 40), (4, 80), (5, 100), (60, 100)])
def test_backoff_doubles_from_the_first_delay_up_to_the_cap(restarts, delay):
    assert backoff_seconds(restarts, base=10, maximum=100) == delay


@pytest.mark.parametrize("restarts,budget,exhausted", [(0, 0, False), (1, 0, True), (5, 5, False), (6, 5, True)])
def test_budget_allows_max_restarts_incidents(restarts, budget, exhausted):
    assert budget_exhausted(restarts, budget) is exhausted


def test_classify_pod_reads_phase_exit_code_reason_and_disruption_condition():
    job = make_ddpjob()
    assert classify_pod(view_pod(make_pod(job, 0))) is None
    assert classify_pod(view_pod(make_pod(job, 0, phase="Pending"))) is None
    assert classify_pod(view_pod(make_pod(job, 0, phase="Succeeded"))) == Outcome.SUCCEEDED
    assert classify_pod(view_pod(make_pod(job, 0, phase="Failed", exit_code=2))) == Outcome.RETRYABLE
    assert classify_pod(view_pod(make_pod(job, 0, phase="Failed", exit_code=127)), PERMANENT) == Outcome.PERMANENT
    assert classify_pod(view_pod(make_pod(job, 0, phase="Failed", reason="Evicted"))) == Outcome.DISRUPTION
    assert classify_pod(view_pod(make_pod(job, 0, phase="Failed", exit_code=143, disrupted=True))) == Outcome.DISRUPTION


@pytest.mark.parametrize("failed,started,incident,new", [
    (0, None, None, True),       # the first failure opens an incident
    (5, None, 0, False),         # a node of unknown age failing 5 s later: cascade
    (5, -100, 0, False),         # an older node failing 5 s later: cascade
    (59, -100, 0, False),        # still inside the 60 s window
    (61, -100, 0, True),         # outside the window
    (5, 2, 0, True),             # a replacement created after the incident failed again
    (5, 0, 0, True),             # ... created in the incident's second (timestamps have whole seconds)
    (-3, -100, 0, False),        # observed out of order, still within the window
])
def test_failures_group_into_incidents(failed, started, incident, new):
    started_at = at(started) if started is not None else None
    incident_at = at(incident) if incident is not None else None
    assert starts_new_incident(at(failed), started_at, incident_at) is new


def test_only_pods_the_job_controls_are_claimed():
    job = make_ddpjob()
    own, copied = make_pod(job, 0), make_pod(job, 1)
    copied["metadata"]["ownerReferences"] = []  # the labels alone
    other = make_pod(job, 2)
    other["metadata"]["ownerReferences"][0]["uid"] = "uid-of-another-job"
    not_controller = make_pod(job, 3)
    not_controller["metadata"]["ownerReferences"][0]["controller"] = False
    views = view_pods([own, copied, other, not_controller])
    assert [p.name for p in claimed(views, "mlp", job["metadata"]["uid"])] == ["mlp-node-0"]


def forged(job: dict, index: int, name: str, component: str | None = None) -> dict:
    """Node pod `index` of `job`, with the job as its controller, renamed `name` (component relabelled)."""
    pod = make_pod(job, index)
    pod["metadata"]["name"] = name
    if component is not None:
        pod["metadata"]["labels"][C.LABEL_COMPONENT] = component
    return pod


def test_a_forged_owner_reference_on_a_pod_named_outside_the_jobs_scheme_claims_nothing():
    job = make_ddpjob()
    pods = [make_pod(job, 0),
            forged(job, 1, "evil-1"),  # every label and the job's uid, another name
            forged(job, 2, "mlp-node-7"),  # a node name, of another index than its label's
            forged(job, 3, "mlp-rdzv-x", C.COMPONENT_RDZV_STORE),
            forged(job, 4, "mlp-etcd-x", C.COMPONENT_ETCD),
            forged(job, 5, "mlp-node-5", "sidecar"),  # an unknown component claims nothing
            forged(job, 6, "mlp-rdzv", C.COMPONENT_RDZV_STORE), forged(job, 7, "mlp-etcd", C.COMPONENT_ETCD)]
    pods[-3]["metadata"]["labels"].pop(C.LABEL_NODE_INDEX)
    assert [p.name for p in claimed(view_pods(pods), "mlp", job["metadata"]["uid"])] == [
        "mlp-node-0", "mlp-rdzv", "mlp-etcd"]
