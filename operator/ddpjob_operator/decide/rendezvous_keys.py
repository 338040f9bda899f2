"""Which jobs have etcd rendezvous keys for the operator to delete, and when (pure).

Only ``etcd-v3`` jobs: their keys live under ``/ddpjob/rdzv/<namespace>/<uid>/`` (and
``<uid>-<n>/`` for later rendezvous generations; ``ddpjob_rdzv.keys``, the one definition the
trainer's backend uses too). torch's ``etcd`` backend writes etcd's v2 store, which the v3
client cannot reach, and puts TTLs on its keys itself; c10d keeps nothing outside the pods;
a managed etcd goes with the job, keys and all.

On finish the keys go once no node pod is still active: deleting them under a live agent
would restart its rendezvous. The pass returns that as a DeleteRendezvousKeys action, which
controller/etcd_cleanup.py executes outside the pass; on deletion a kopf finalizer (only on
jobs that have keys, ``of_body``) deletes them.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from ddpjob_operator.api.job_ref import JobRef
from ddpjob_operator.api.spec import DDPJobSpec
from ddpjob_operator.api.validation import checked_job
from ddpjob_operator.decide import phases
from ddpjob_operator.decide.actions import DeleteRendezvousKeys
from ddpjob_operator.decide.observed import PodView
from ddpjob_operator.render.launch import rdzv_id
from ddpjob_rdzv import BACKEND_NAME, keys


def keys_of(ref: JobRef, spec: DDPJobSpec, status: Mapping[str, Any] | None) -> DeleteRendezvousKeys | None:
    """The keys of a job with a valid ``spec``; None for other backends, a managed etcd or a job without a uid."""
    ep = spec.elastic_policy
    if not ref.uid or ep.rdzv_backend != BACKEND_NAME or ep.managed_etcd.enabled:
        return None
    # Later groups ran as <uid>-<generation> (launch.rdzv_id), each under its own prefix.
    generations = int((status or {}).get("rendezvousGeneration") or 0)
    first = keys.run_prefix(ref.namespace, ref.uid)
    prefix = first if not generations else f"{first} (and {generations} later generation(s))"
    return DeleteRendezvousKeys(tuple(ep.rdzv_endpoints), ref.uid,
                                tuple(rdzv_id(ref.uid, g) for g in range(generations + 1)), prefix,
                                ep.rdzv_secret_name, ref.namespace, ep.rdzv_allow_insecure_credentials)


def of_body(body: Mapping[str, Any]) -> DeleteRendezvousKeys | None:
    """The keys of a DDPJob object as the API holds it (the deletion finalizer's view); None
    also for an invalid spec, where nothing is assumed."""
    if not (body.get("metadata") or {}).get("uid"):
        return None
    errors, spec = checked_job(body)  # parsed once
    return None if errors or spec is None else keys_of(JobRef.from_body(body), spec, body.get("status"))


def due_on_finish(status: Mapping[str, Any], pods: Iterable[PodView]) -> bool:
    """Finished, and no node pod still runs an agent that would miss its rendezvous state."""
    return phases.finished(status) and not any(p.active for p in pods)


def on_finish(ref: JobRef, spec: DDPJobSpec | None, status: Mapping[str, Any],
              pods: Iterable[PodView]) -> list[DeleteRendezvousKeys]:
    """The pass's DeleteRendezvousKeys: once the job finished and its agents are gone (every
    pass from then on says so; the executor runs it once per job)."""
    keys = keys_of(ref, spec, status) if spec is not None else None
    return [keys] if keys is not None and due_on_finish(status, pods) else []
