"""The executor makes a pass's NetworkPolicy create first, and creates no pod when it failed
(controller/handlers.py, decide/isolation.py): a fake API records the order of the writes."""
from __future__ import annotations

import asyncio

import pytest

from ddpjob_operator.controller import handlers, kube
from ddpjob_operator.controller.backoff import CreateRetries
from ddpjob_operator.decide.actions import CreateNetworkPolicy, CreatePod, CreateService
from ddpjob_operator.decide.reconcile import Reconciliation

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
        return True


def apply(api: Api) -> list[str]:
    result = Reconciliation({}, [], [CreateNetworkPolicy(body("NetworkPolicy", "mlp")),
                                     CreateService(body("Service", "mlp")), CreatePod(body("Pod", "mlp-node-0"))])
    asyncio.run(handlers._apply(api, JOB, (), result, CreateRetries()))
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
