"""The NetworkPolicies ddpjob makes are valid to the real API server (a strict server-side dry run).

What they admit is not the API server's to say: it stores a NetworkPolicy and a network plugin
enforces it, and the sandbox runs no pod network (tests/support/network_policy.py evaluates them
instead, in tests/operator/render/test_network_policy.py and tests/charts/test_chart_etcd.py).
Here the server validates each one as `kubectl apply` would: the operator's policy for a job, with
the chart's operator peer and with the operator's namespace unknown, and the chart's policy for
its shared etcd.
"""
from __future__ import annotations

import pytest

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.job_ref import JobRef
from ddpjob_operator.render.network_policy import OperatorPeer, render_network_policy
from tests.charts.support import one, render
from tests.cluster.dry_run import refusal

pytestmark = pytest.mark.cluster

PEERS = {
    "the chart's operator": OperatorPeer(((C.LABEL_APP_NAME, "ddpjob-operator"), (C.LABEL_INSTANCE, "ddpjob")),
                                         "ddpjob-system"),
    "operator namespace unknown": OperatorPeer(),
}
ETCD = {"etcd": {"enabled": True}}


def job_policy(namespace: str, peer: OperatorPeer) -> dict:
    return render_network_policy(JobRef(name="mlp", namespace=namespace, uid="uid-mlp"), peer)


@pytest.mark.parametrize("peer", PEERS.values(), ids=PEERS.keys())
def test_the_operators_policy_for_a_job_is_valid(kube, peer):
    assert refusal(kube, "networkpolicies", job_policy(kube.namespace, peer)) is None


@pytest.mark.parametrize("values", [ETCD, {**ETCD, "watchNamespaces": ["team-a", "team-b"]}],
                         ids=["all namespaces", "watched namespaces"])
def test_the_charts_shared_etcd_policy_is_valid(kube, values):
    policy = one(render(values, namespace=kube.namespace), "NetworkPolicy")
    assert refusal(kube, "networkpolicies", policy) is None


def test_an_invalid_policy_is_refused_naming_the_field(kube):
    """The dry run validates: a port protocol the API does not know is refused."""
    policy = job_policy(kube.namespace, PEERS["the chart's operator"])
    policy["spec"]["ingress"][1]["ports"][0]["protocol"] = "HTTP"
    error = refusal(kube, "networkpolicies", policy)
    assert error is not None and error.status == 422, error
    assert [c["field"] for c in error.body["details"]["causes"]] == ["spec.ingress[1].ports[0].protocol"]
