"""A job's own single-member etcd (`spec.elasticPolicy.managedEtcd.enabled`): render and plan, pure.

For jobs that want an etcd rendezvous (no node hosts the state, so losing any
node replaces only that node) without an etcd to share. The operator runs pod
and Service `<job>-etcd`, both owned by the job (garbage collection removes them
with it), and points every node's PET_RDZV_ENDPOINT at the Service.

The pod deliberately lacks the job-name label: node-pod listing, scaling and
status never see it. handlers.py observes it by its own selector
(`etcd_selector`) and passes what it saw to `plan_managed_etcd`, whose actions
(plan.py's CreatePod/CreateService/DeletePod) kube.py executes like any other.

Lifecycle: created with the job's first pass (the agents' etcd client retries
for rdzv_conf read_timeout, 60 s, while it starts); a pod that failed or was
evicted is deleted and created again (its emptyDir data, the rendezvous state,
is gone, which torch's agents survive by rendezvousing again); deleted when the
job finishes (it holds nothing worth keeping), the Service goes with the job.
"""

from __future__ import annotations

from typing import Any, Mapping

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.names import managed_etcd_name
from ddpjob_operator.decide.actions import Action, CreatePod, CreateService, DeletePod
from ddpjob_operator.decide.observed import ObservedEtcd
from ddpjob_operator.api.spec import DDPJobSpec, JobRef
from ddpjob_operator.render.etcd_pod import render_etcd_pod, render_etcd_service


def requested(body: Mapping[str, Any]) -> bool:
    """The body asks for a managed etcd (read before validation, to decide what to observe)."""
    ep = (body.get("spec") or {}).get("elasticPolicy") or {}
    return bool((ep.get("managedEtcd") or {}).get("enabled"))


def plan_managed_etcd(ref: JobRef, spec: DDPJobSpec | None, phase: str | None,
                      observed: ObservedEtcd | None) -> list[Action]:
    """Create the Service and pod when missing, replace a failed pod, delete the pod once the job finished.

    Args:
        ref: the job's identity.
        spec: the parsed spec; None when invalid (nothing is done).
        phase: status.phase computed for this pass.
        observed: what the pass saw; None when the job does not ask for a managed etcd.
    """
    if spec is None or observed is None or not spec.elastic_policy.managed_etcd.enabled:
        return []
    pod, name = observed.pod, managed_etcd_name(ref.name)
    if phase in C.FINISHED_PHASES:
        return [DeletePod(name, "the job finished")] if pod is not None and not pod.deleting else []
    actions: list[Action] = [] if observed.service_exists else [CreateService(render_etcd_service(ref))]
    if pod is None:
        actions.append(CreatePod(render_etcd_pod(ref, spec)))
    elif pod.phase in ("Failed", "Succeeded") and not pod.deleting:
        actions.append(DeletePod(name, "replacing the failed managed etcd pod"))
    return actions
