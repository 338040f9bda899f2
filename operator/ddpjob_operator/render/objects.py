"""Every object a job wants, as one list (pure): what `ddpjob render` prints and what the plan creates.

Which objects a spec asks for (the c10d store pod, a managed etcd, the NetworkPolicy, the
PodDisruptionBudget) is decided here once; decide/ compares this list with what a pass
observed, and the command line prints it. Each entry carries its kind and name, and renders
its body only when asked: a pass over a 1,000-node job renders the pods it creates, not all.

The order is the order of creation: the job's Service, the managed etcd's Service and pod
and the store's (the nodes rendezvous through them), the node pods, then the NetworkPolicy
and the PodDisruptionBudget (the plan puts the policy first of all: decide/isolation.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Sequence

from ddpjob_operator.api.names import disruption_budget_name, managed_etcd_name, network_policy_name, pod_name
from ddpjob_operator.api.names import rdzv_store_name, service_name
from ddpjob_operator.api.job_ref import JobRef
from ddpjob_operator.api.spec import DDPJobSpec
from ddpjob_operator.render.etcd_pod import render_etcd_pod, render_etcd_service
from ddpjob_operator.render.network_policy import OperatorPeer, render_network_policy
from ddpjob_operator.render.node_pod import render_pod, render_service
from ddpjob_operator.render.pdb import render_disruption_budget
from ddpjob_operator.render.store_pod import render_store_pod, render_store_service

# What an object is to the job (a role, since kind alone does not tell the job's Service from the store's).
SERVICE = "service"  # the headless Service of the node pods
ETCD_SERVICE = "etcd-service"  # the managed etcd's Service
ETCD = "etcd"  # the managed etcd's pod
STORE_SERVICE = "store-service"  # the c10d store pod's Service
STORE = "store"  # the c10d store pod (rdzvStore: pod)
NODE = "node"  # one node pod per index
NETWORK_POLICY = "network-policy"
DISRUPTION_BUDGET = "disruption-budget"


@dataclass(frozen=True)
class Wanted:
    """One object the job wants; `body()` renders it."""

    role: str
    name: str
    index: int | None = None  # a node pod's index
    render: Callable[[], dict[str, Any]] = field(default=dict, compare=False, repr=False)

    def body(self) -> dict[str, Any]:
        return self.render()


def wanted_objects(ref: JobRef, spec: DDPJobSpec, *, operator: OperatorPeer = OperatorPeer(), generation: int = 0,
                   avoid: Sequence[str] = (), healthy: int | None = None,
                   roles: Collection[str] | None = None) -> tuple[Wanted, ...]:
    """Every object the job wants, in the order of creation (of ``roles`` only, when given).

    Args:
        ref: the job's identity.
        spec: the parsed, valid spec.
        operator: the operator's pods, as the NetworkPolicy admits them (the chart's defaults
            when not given, as `ddpjob render` shows them).
        generation: the rendezvous generation new node pods join.
        avoid: nodes new node pods keep off (status.avoidedNodes).
        healthy: the budgeted pods Ready now (None: all of them, the job running whole).
        roles: the roles a caller asks about (None: all): a policy about one companion object
            does not list 1,000 node pods to find it.
    """
    ep = spec.elastic_policy
    objects = [Wanted(SERVICE, service_name(ref.name), render=lambda: render_service(ref, spec))]
    if ep.managed_etcd.enabled:
        objects += [Wanted(ETCD_SERVICE, managed_etcd_name(ref.name), render=lambda: render_etcd_service(ref)),
                    Wanted(ETCD, managed_etcd_name(ref.name), render=lambda: render_etcd_pod(ref, spec))]
    if ep.store_on_pod:
        objects += [Wanted(STORE_SERVICE, rdzv_store_name(ref.name), render=lambda: render_store_service(ref, spec)),
                    Wanted(STORE, rdzv_store_name(ref.name), render=lambda: render_store_pod(ref, spec))]
    if roles is None or NODE in roles:
        objects += [Wanted(NODE, pod_name(ref.name, i), i, _node(ref, spec, i, generation, avoid))
                    for i in range(spec.node_pods)]  # the replicas, then the spares
    if spec.network_policy.enabled:
        objects.append(Wanted(NETWORK_POLICY, network_policy_name(ref.name),
                              render=lambda: render_network_policy(ref, operator)))
    if spec.run_policy.pod_disruption_budget:
        objects.append(Wanted(DISRUPTION_BUDGET, disruption_budget_name(ref.name),
                              render=lambda: render_disruption_budget(ref, spec, healthy)))
    return tuple(o for o in objects if roles is None or o.role in roles)


def _node(ref: JobRef, spec: DDPJobSpec, index: int, generation: int,
          avoid: Sequence[str]) -> Callable[[], dict[str, Any]]:
    return lambda: render_pod(ref, spec, index, generation, avoid)


def of_role(objects: Sequence[Wanted], role: str) -> tuple[Wanted, ...]:
    """The wanted objects of one role (every node pod, or the one Service, ...)."""
    return tuple(o for o in objects if o.role == role)


def one(objects: Sequence[Wanted], role: str) -> Wanted | None:
    """The wanted object of a role that has one (None: the spec does not ask for it)."""
    return next((o for o in objects if o.role == role), None)
