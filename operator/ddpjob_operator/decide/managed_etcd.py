"""The plan of a job's own single-member etcd (`spec.elasticPolicy.managedEtcd.enabled`), pure.

What the pod and Service look like, and why the pod lacks the job-name label, is in
render/etcd_pod.py. Here: the controller observes them by their own selector and
`plan_managed_etcd` returns the actions. Created with the job's first pass (the
agents' etcd client retries for rdzv_conf read_timeout, 60 s, while it starts); a pod
that failed or was evicted is deleted and created again (its emptyDir data, the
rendezvous state, is gone, which torch's agents survive by rendezvousing again);
deleted when the job finishes (it holds nothing worth keeping), the Service goes with
the job.
"""

from __future__ import annotations

from ddpjob_operator.api import constants as C
from ddpjob_operator.decide.actions import Action, CreatePod, CreateService, DeletePod
from ddpjob_operator.decide.observed import ObservedEtcd
from ddpjob_operator.api.job_ref import JobRef
from ddpjob_operator.api.spec import DDPJobSpec
from ddpjob_operator.render import objects as wanted


def plan_managed_etcd(ref: JobRef, spec: DDPJobSpec | None, phase: str | None,
                      observed: ObservedEtcd | None) -> list[Action]:
    """Create the Service and pod when missing, replace a failed pod, delete the pod once the job finished.

    Args:
        ref: the job's identity.
        spec: the parsed spec; None when invalid (nothing is done).
        phase: status.phase computed for this pass.
        observed: what the pass saw; None when the job does not ask for a managed etcd.
    """
    objects = wanted.wanted_objects(ref, spec, roles=(wanted.ETCD_SERVICE, wanted.ETCD)) if spec is not None else ()
    service, etcd = wanted.one(objects, wanted.ETCD_SERVICE), wanted.one(objects, wanted.ETCD)
    if observed is None or service is None or etcd is None:
        return []
    pod, name = observed.pod, etcd.name
    if phase in C.FINISHED_PHASES:
        return [DeletePod(name, "the job finished")] if pod is not None and not pod.deleting else []
    actions: list[Action] = [] if observed.service_exists else [CreateService(service.body())]
    if pod is None:
        actions.append(CreatePod(etcd.body()))
    elif pod.phase in ("Failed", "Succeeded") and not pod.deleting:
        actions.append(DeletePod(name, "replacing the failed managed etcd pod"))
    return actions
