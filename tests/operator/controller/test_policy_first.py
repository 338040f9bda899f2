"""The executor makes a pass's NetworkPolicy create first, and creates no pod when it failed
(controller/apply.py, decide/isolation.py): a fake API records the order of the writes."""
from __future__ import annotations

import asyncio

import pytest

from ddpjob_operator.api import constants as C
from ddpjob_operator.controller import apply as executor, kube, observe
from ddpjob_operator.controller.backoff import CreateRetries
from ddpjob_operator.controller.cache import ClusterCache
from ddpjob_operator.controller.memory import ApiMemory
from ddpjob_operator.decide.actions import CreateNetworkPolicy, CreatePod, CreateService
from ddpjob_operator.decide.isolation import FOREIGN_POLICY_RECHECK_SECONDS

JOB = {"metadata": {"name": "mlp", "namespace": "ns", "uid": "uid-mlp"}}


def body(kind: str, name: str) -> dict:
    return {"apiVersion": "networking.k8s.io/v1" if kind == "NetworkPolicy" else "v1", "kind": kind,
            "metadata": {"name": name}}


class Api:
    """Records creates in order; the policy's create fails as `policy_error` says."""

    def __init__(self, policy_error: Exception | None = None):
        self.created: list[str] = []
        self.policy_error = policy_error

    async def create_or_skip(self, obj, namespace):
        if obj["kind"] == "NetworkPolicy" and self.policy_error is not None:
            raise self.policy_error
        await asyncio.sleep(0)
        self.created.append(f"{obj['kind']}/{obj['metadata']['name']}")
        return obj


def apply(api: Api, memory: ApiMemory | None = None) -> list[str]:
    actions = [CreateNetworkPolicy(body("NetworkPolicy", "mlp")), CreateService(body("Service", "mlp")),
               CreatePod(body("Pod", "mlp-node-0"))]
    asyncio.run(executor.apply(api, ClusterCache(api), JOB, (), actions, CreateRetries(), memory or ApiMemory()))
    return api.created


def test_the_policy_is_created_before_any_pod():
    assert apply(Api()) == ["NetworkPolicy/mlp", "Service/mlp", "Pod/mlp-node-0"]


@pytest.mark.parametrize("error,created", [
    (kube.ForeignObjectError("NetworkPolicy", "mlp", {"kind": "DDPJob", "name": "mlp", "uid": "uid-mlp"}, None,
                             "POST"), ["Service/mlp"]),  # someone else's policy: no pod this pass
    (kube.ApiError(403, "Forbidden", "no grant", "POST"), ["Service/mlp", "Pod/mlp-node-0"]),  # runs without one
])
def test_a_failed_policy_create_holds_the_pods_unless_the_grant_is_missing(error, created):
    assert apply(Api(error)) == created


class PolicyCache:
    """The cache as the pass reads it: policies listed (only those with the operator's label), `held` among them."""

    def __init__(self, held: dict | None = None):
        self.held = held

    def exists(self, kind, namespace, name):
        return self.held is not None

    def get(self, kind, namespace, name):
        return self.held

    def refusal(self, kind, namespace):
        return None


def test_someone_elses_unlabelled_policy_is_reported_from_its_409_and_its_create_tried_again_a_minute_later():
    """The cache never holds a policy without the operator's label: the 409 read back is what
    says the name is taken. The job then reports it (pods wait) without a create every pass."""
    clock = [1000.0]
    memory = ApiMemory(clock=lambda: clock[0])
    foreign = kube.ForeignObjectError("NetworkPolicy", "mlp", {"kind": "DDPJob", "name": "mlp", "uid": "uid-mlp"},
                                      None, "POST")
    assert observe._network_policy(PolicyCache(), JOB, memory).state == C.POLICY_ABSENT
    assert apply(Api(foreign), memory) == ["Service/mlp"]
    clock[0] += FOREIGN_POLICY_RECHECK_SECONDS - 1
    assert observe._network_policy(PolicyCache(), JOB, memory).state == C.POLICY_FOREIGN
    clock[0] += 1
    assert observe._network_policy(PolicyCache(), JOB, memory).state == C.POLICY_ABSENT


def test_a_refused_policy_create_is_remembered_for_its_namespace_until_one_goes_through():
    """A 403 on the create makes the next pass report UNCREATABLE (the job runs without one);
    a create that later goes through clears it. The memory is the operator's, not the module's."""
    memory = ApiMemory()
    assert apply(Api(kube.ApiError(403, "Forbidden", "no grant", "POST")), memory) == ["Service/mlp", "Pod/mlp-node-0"]
    assert observe._network_policy(PolicyCache(), JOB, memory).state == C.POLICY_UNCREATABLE
    assert observe._network_policy(PolicyCache(), JOB, ApiMemory()).state == C.POLICY_ABSENT, "another operator's memory"
    apply(Api(), memory)
    assert observe._network_policy(PolicyCache(), JOB, memory).state == C.POLICY_ABSENT
