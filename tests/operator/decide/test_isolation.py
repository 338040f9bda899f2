"""The job's NetworkPolicy comes before its pods, is put back when edited, and shows in a
condition (decide/isolation.py, through reconcile): pure, with the policy as a pass reads it."""
from __future__ import annotations

import pytest

from ddpjob_operator.api import constants as C
from ddpjob_operator.decide.actions import CreateNetworkPolicy, CreatePod, CreateService, PatchNetworkPolicy, Requeue
from ddpjob_operator.decide.conditions import condition_of
from ddpjob_operator.decide.observed import Observed, ObservedEtcd, ObservedPolicy
from ddpjob_operator.decide.reconcile import reconcile
from ddpjob_operator.render.network_policy import OperatorPeer, render_network_policy
from ddpjob_sandbox.jobs import make_ddpjob
from tests.operator.builders import at, job_ref

PEER = OperatorPeer(((C.LABEL_APP_NAME, "ddpjob-operator"),), "ddpjob-system")


def job(**fields) -> dict:
    return make_ddpjob(replicas=2, elasticPolicy={"rdzvStore": "node"}, **fields)


def wanted(body: dict) -> dict:
    return render_network_policy(job_ref(body), PEER)


def a_pass(body: dict, policy: ObservedPolicy | None):
    return reconcile(body, Observed(service_exists=False, network_policy=policy), at(0), operator=PEER)


def kinds(actions) -> list[str]:
    return [type(a).__name__ for a in actions]


def policy_condition(result) -> dict:
    return dict(condition_of(result.status.get("conditions"), C.COND_NETWORK_POLICY) or {})


def test_a_missing_policy_is_the_first_action_of_the_pass():
    body = job()
    result = a_pass(body, ObservedPolicy(C.POLICY_ABSENT))
    # The executor makes the first action, and sees it succeed, before the pods (controller/apply.py).
    assert result.actions[0] == CreateNetworkPolicy(wanted(body))
    assert [type(a) for a in result.actions[1:]] == [CreateService, CreatePod, CreatePod]
    cond = policy_condition(result)
    assert (cond["status"], cond["reason"]) == ("False", "Missing")
    assert cond["message"] == "NetworkPolicy mlp does not exist: the operator creates it, and the job's pods only once it did"
    assert not [e for e in result.events if e.reason == C.REASON_NETWORK_POLICY]  # every job's first pass


def test_with_the_policy_in_place_the_pods_are_created_and_the_condition_is_true():
    body = job()
    result = a_pass(body, ObservedPolicy(C.POLICY_PRESENT, wanted(body)["spec"]))
    assert kinds(result.actions) == ["CreateService", "CreatePod", "CreatePod"]
    cond = policy_condition(result)
    assert (cond["status"], cond["reason"]) == ("True", "Present")


def test_an_edited_policy_is_put_back_whole_with_a_warning_and_the_pods_are_not_held():
    body = job()
    opened = {**wanted(body)["spec"], "ingress": [{}]}  # admits everyone
    result = a_pass(body, ObservedPolicy(C.POLICY_PRESENT, opened))
    assert result.actions[0] == PatchNetworkPolicy("mlp", opened, wanted(body)["spec"])
    assert kinds(result.actions).count("CreatePod") == 2
    cond = policy_condition(result)
    assert (cond["status"], cond["reason"], cond["message"]) == (
        "False", "Drifted", "NetworkPolicy mlp was edited: the operator puts its spec back")
    assert [(e.type, e.reason) for e in result.events if e.reason == C.REASON_NETWORK_POLICY] == [
        (C.EVENT_WARNING, C.REASON_NETWORK_POLICY)]


def test_someone_elses_policy_of_that_name_is_left_alone_and_the_pods_wait():
    body = job()
    result = a_pass(body, ObservedPolicy(C.POLICY_FOREIGN))
    assert not [a for a in result.actions if isinstance(a, (CreatePod, CreateNetworkPolicy, PatchNetworkPolicy))]
    cond = policy_condition(result)
    assert (cond["status"], cond["reason"]) == ("False", "ForeignObject")
    assert "exists but the job does not control it" in cond["message"]
    assert [e.message for e in result.events if e.reason == C.REASON_NETWORK_POLICY] == [cond["message"]]


@pytest.mark.parametrize("state,creates,message", [
    (C.POLICY_UNREADABLE, False, "the operator may not list NetworkPolicies in namespace default: the job runs "
                                 "without mlp, reachable by any pod; grant list, watch and create on "
                                 "networking.k8s.io networkpolicies (the chart does)"),
    (C.POLICY_UNCREATABLE, True, "the operator may not create NetworkPolicy mlp in namespace default: the job runs "
                                 "without it, reachable by any pod; grant create on networking.k8s.io "
                                 "networkpolicies (the chart does)"),
])
def test_without_the_grant_the_job_runs_without_a_policy_and_says_so(state, creates, message):
    result = a_pass(job(), ObservedPolicy(state))
    assert kinds(result.actions).count("CreatePod") == 2
    assert kinds(result.actions).count("CreateNetworkPolicy") == int(creates)  # a later grant takes effect
    cond = policy_condition(result)
    assert (cond["status"], cond["reason"], cond["message"]) == ("False", state, message)
    assert [e.type for e in result.events if e.reason == C.REASON_NETWORK_POLICY] == [C.EVENT_WARNING]


def test_a_policy_that_goes_missing_after_it_existed_is_a_warning_and_created_again_first():
    body = job()
    body["status"] = {"conditions": [{"type": C.COND_NETWORK_POLICY, "status": "True", "reason": "Present",
                                      "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
    result = a_pass(body, ObservedPolicy(C.POLICY_ABSENT))
    assert [e.type for e in result.events if e.reason == C.REASON_NETWORK_POLICY] == [C.EVENT_WARNING]
    assert isinstance(result.actions[0], CreateNetworkPolicy)


def test_the_managed_etcd_pod_comes_after_the_policy_too():
    body = make_ddpjob(replicas=1, elasticPolicy={"rdzvBackend": "etcd-v3", "managedEtcd": {"enabled": True}})
    observed = Observed(service_exists=False, network_policy=ObservedPolicy(C.POLICY_ABSENT),
                        managed_etcd=ObservedEtcd(pod=None, service_exists=False))
    result = reconcile(body, observed, at(0), operator=PEER)
    assert isinstance(result.actions[0], CreateNetworkPolicy)
    assert "mlp-etcd" in [a.body["metadata"]["name"] for a in result.actions if isinstance(a, CreatePod)]


def test_while_someone_elses_policy_has_the_name_no_pod_is_created_and_the_pass_comes_back():
    result = a_pass(job(), ObservedPolicy(C.POLICY_FOREIGN))
    assert [type(a) for a in result.actions] == [CreateService, Requeue]


def test_a_job_that_turns_it_off_runs_with_the_condition_saying_so():
    result = a_pass(job(networkPolicy={"enabled": False}), None)
    assert kinds(result.actions) == ["CreateService", "CreatePod", "CreatePod"]
    cond = policy_condition(result)
    assert (cond["status"], cond["reason"]) == ("False", "Disabled")
