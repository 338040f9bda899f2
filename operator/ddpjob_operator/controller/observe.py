"""What a pass reads: the cache's copy of the job's objects, and the few things read from the
API, as decide/observation.py lists them; the result is the pure ``Observed`` that
decide.reconcile decides on.

The cache is fed by watches (cache.py), so a steady-state pass makes no LIST and no GET. Only
the Nodes of pods stuck terminating are read from the API (rare, and not worth watching every
Node of the cluster for), and a training job's progress endpoint (live_progress.py).
"""
from __future__ import annotations

import datetime
import logging

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.names import disruption_budget_name, managed_etcd_name, network_policy_name, rdzv_store_name
from ddpjob_operator.controller import kube, live_progress
from ddpjob_operator.controller.cache import DISRUPTION_BUDGETS, NETWORK_POLICIES, SERVICES, ClusterCache
from ddpjob_operator.controller.memory import NO_BUDGET_GRANT, NO_POLICY_GRANT, ApiMemory
from ddpjob_operator.decide import isolation
from ddpjob_operator.decide.observation import Observation
from ddpjob_operator.decide.observed import (
    Observed, ObservedBudget, ObservedEtcd, ObservedPolicy, PodView, claimed, in_pod_order
)

logger = logging.getLogger("ddpjob_operator")



async def observe(api: kube.Kube, cache: ClusterCache, job: dict, wanted: Observation, memory: ApiMemory) -> Observed:
    """Everything the pass decides on: the cache's pods (only those the job controls: a copied
    label claims nothing) and Services, then what ``wanted`` asks for."""
    namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
    owned = claimed(cache.pods(namespace, name), name, job["metadata"].get("uid", ""))
    pods = in_pod_order(p for p in owned if p.component != C.COMPONENT_ETCD)  # the pass's one sort
    live = await live_progress.read_live_progress(pods) if wanted.progress else []
    now = datetime.datetime.now(datetime.timezone.utc)
    return Observed(pods, bool(cache.exists(SERVICES, namespace, name)), tuple(live),
                    _managed_etcd(cache, job, owned) if wanted.managed_etcd else None,
                    await _nodes(api, wanted.nodes(pods, now)),
                    _network_policy(cache, job, memory) if wanted.network_policy else None,
                    _disruption_budget(cache, job, memory) if wanted.disruption_budget else None,
                    store_service_exists=bool(cache.exists(SERVICES, namespace, rdzv_store_name(name))))


def _managed_etcd(cache: ClusterCache, job: dict, owned: tuple[PodView, ...]) -> ObservedEtcd:
    """The job's own etcd pod and Service (decide/managed_etcd.py)."""
    pod = next((p for p in owned if p.component == C.COMPONENT_ETCD), None)
    namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
    return ObservedEtcd(pod=pod, service_exists=bool(cache.exists(SERVICES, namespace, managed_etcd_name(name))))


def _network_policy(cache: ClusterCache, job: dict, memory: ApiMemory) -> ObservedPolicy:
    """The job's NetworkPolicy as the cache holds it, with what the API said of its creates
    (memory). Without the grant to list them (403) it is unreadable: the job runs without one,
    its condition and the log say so."""
    namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
    key = (namespace, network_policy_name(name))
    readable = cache.exists(NETWORK_POLICIES, *key) is not None
    if not readable:
        memory.warn_missing_grant("NetworkPolicy", namespace, NO_POLICY_GRANT, namespace,
                                  cache.refusal(NETWORK_POLICIES, namespace))
    return isolation.observed_policy(cache.get(NETWORK_POLICIES, *key) if readable else None,
                                     job["metadata"].get("uid", ""), readable=readable,
                                     create_refused=namespace in memory.policy_create_refused,
                                     foreign_seconds_ago=memory.foreign_seconds_ago(key))


def _disruption_budget(cache: ClusterCache, job: dict, memory: ApiMemory) -> ObservedBudget | None:
    """The job's PodDisruptionBudget (render/pdb.py), from the cache; None when the operator may
    not list PodDisruptionBudgets (403: the job then runs without one, and the log says so)."""
    namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
    budget_name = disruption_budget_name(name)
    if cache.exists(DISRUPTION_BUDGETS, namespace, budget_name) is None:
        memory.warn_missing_grant("PodDisruptionBudget", namespace, NO_BUDGET_GRANT, namespace,
                                  cache.refusal(DISRUPTION_BUDGETS, namespace))
        return None
    return ObservedBudget.of(cache.get(DISRUPTION_BUDGETS, namespace, budget_name), job["metadata"].get("uid", ""))


async def _nodes(api: kube.Kube, names: list[str]) -> dict[str, dict | None]:
    """The Nodes of pods stuck terminating (None: the node is gone). Without the grant to read
    nodes (403) a node stays unknown and its pods are never force-deleted."""
    nodes: dict[str, dict | None] = {}
    for node in names:
        try:
            nodes[node] = await api.get_node(node)
        except kube.ApiError as e:
            if e.status != 403:
                raise
            logger.warning("Cannot read node %s (%s): pods stuck on it are not force-deleted", node, e)
    return nodes
