"""One list of a job's objects (render/objects.py) serves the plan and `ddpjob render`: what a
first pass creates is what the command prints, object for object."""
from __future__ import annotations

import pytest

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.validation import parse_spec
from ddpjob_operator.decide.actions import CreateDisruptionBudget, CreateNetworkPolicy, CreatePod, CreateService
from ddpjob_operator.decide.observed import Observed, ObservedBudget, ObservedEtcd, ObservedPolicy
from ddpjob_operator.decide.reconcile import reconcile
from ddpjob_operator.render import objects
from ddpjob_sandbox.jobs import make_ddpjob
from tests.operator.builders import at, job_ref

CREATES = (CreateService, CreatePod, CreateNetworkPolicy, CreateDisruptionBudget)
MANAGED_ETCD = {"rdzvBackend": "etcd-v3", "managedEtcd": {"enabled": True}}


def listed(body: dict) -> list[tuple[str, str]]:
    return [(o.role, o.name) for o in objects.wanted_objects(job_ref(body), parse_spec(body["spec"]))]


def test_the_list_follows_the_spec_in_the_order_of_creation():
    assert listed(make_ddpjob(replicas=2, elasticPolicy=MANAGED_ETCD)) == [
        ("service", "mlp"), ("etcd-service", "mlp-etcd"), ("etcd", "mlp-etcd"), ("node", "mlp-node-0"),
        ("node", "mlp-node-1"), ("network-policy", "mlp"), ("disruption-budget", "mlp")]
    assert listed(make_ddpjob(replicas=1, elasticPolicy={"rdzvStore": "pod"}, networkPolicy={"enabled": False},
                              runPolicy={"podDisruptionBudget": False})) == [
        ("service", "mlp"), ("store-service", "mlp-rdzv"), ("store", "mlp-rdzv"), ("node", "mlp-node-0")]


def test_an_entry_renders_its_body_only_when_asked():
    calls = []
    entry = objects.Wanted("node", "mlp-node-0", 0, lambda: calls.append(1) or {"kind": "Pod"})
    assert calls == []
    assert entry.body() == {"kind": "Pod"} and calls == [1]


@pytest.mark.parametrize("elastic", [MANAGED_ETCD, {"rdzvStore": "node"}], ids=["managed etcd", "c10d on node 0"])
def test_a_first_pass_creates_exactly_the_objects_the_list_names(elastic):
    body = make_ddpjob(replicas=3, elasticPolicy=elastic)
    nothing = Observed(service_exists=False, store_service_exists=False, network_policy=ObservedPolicy(C.POLICY_ABSENT),
                       disruption_budget=ObservedBudget(None), managed_etcd=ObservedEtcd(None, False)
                       if elastic is MANAGED_ETCD else None)
    created = [a.body for a in reconcile(body, nothing, at(0)).actions if isinstance(a, CREATES)]
    wanted = [o.body() for o in objects.wanted_objects(job_ref(body), parse_spec(body["spec"]), healthy=0)]

    def key(o: dict) -> tuple[str, str]:
        return o["kind"], o["metadata"]["name"]
    assert sorted(map(key, created)) == sorted(map(key, wanted))
    assert sorted(created, key=key) == sorted(wanted, key=key), "the same bodies, not only the same names"


def test_a_policy_may_ask_for_some_roles_only_and_gets_the_same_entries():
    body = make_ddpjob(replicas=4, elasticPolicy=MANAGED_ETCD)
    ref, spec = job_ref(body), parse_spec(body["spec"])
    etcd = objects.wanted_objects(ref, spec, roles=(objects.ETCD_SERVICE, objects.ETCD))

    assert etcd == tuple(o for o in objects.wanted_objects(ref, spec) if o.role in (objects.ETCD_SERVICE, objects.ETCD))
    assert [o.role for o in etcd] == ["etcd-service", "etcd"]
