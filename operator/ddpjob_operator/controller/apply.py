"""Carries out what a pass decided: its status, its actions and its Events, in that order.

1. the status is written once, when it changed, *before* acting, so a failure that is about to
   be replaced is counted durably even if the operator dies right after;
2. the actions: the NetworkPolicy first, and no pod unless it went through
   (decide/isolation.py); creates go in waves of 1, 2, 4, ... that stop at the first refusal,
   and a refused create is kept for the next pass, which reports it (PodCreateFailed), while
   the job's creates back off (backoff.CreateRetries); the other writes go at once;
3. the Events (events.py), only when something changed.

Every call goes through kube.py (create-or-skip on 409, delete-or-skip on 404). Deleting
rendezvous keys is not done here: etcd_cleanup.py runs it outside the pass.
"""
from __future__ import annotations

import asyncio
import logging

from ddpjob_operator.controller import kube, metrics
from ddpjob_operator.controller.backoff import CreateRetries
from ddpjob_operator.controller.cache import ClusterCache
from ddpjob_operator.controller.memory import NO_BUDGET_GRANT, NO_POLICY_GRANT, ApiMemory
from ddpjob_operator.controller.passes import COALESCE_SECONDS, JobKey
from ddpjob_operator.decide.actions import (
    Action, CreateDisruptionBudget, CreateNetworkPolicy, CreatePod, CreateService, DeleteDisruptionBudget, DeleteJob,
    DeletePod, PatchDisruptionBudget, PatchNetworkPolicy, Requeue
)
from ddpjob_operator.decide.creation import CreateFailure
from ddpjob_operator.decide.observed import PodView

logger = logging.getLogger("ddpjob_operator")



async def write_status(api: kube.Kube, cache: ClusterCache, job: dict, status: dict) -> None:
    """One status PATCH when the status changed (none when it did not). Its answer goes into the
    cache at once, so the next pass counts from it even before the watch brings it."""
    old = job.get("status") or {}
    if status == old:
        return
    patched = await api.patch_job_status(job["metadata"]["namespace"], job["metadata"]["name"],
                                         merge_patch(old, status))
    if patched:
        cache.offer(patched)
    metrics.observe_restarts(int(old.get("restarts") or 0), int(status.get("restarts") or 0))
    metrics.observe_status_change(old, status)


def merge_patch(old: dict, new: dict) -> dict:
    """The JSON merge patch (RFC 7386) from ``old`` to ``new``: removed keys become null, at any
    depth; unchanged keys are left out, so a large value that did not change is not sent again."""
    patch = {key: None for key in old if key not in new}
    for key, value in new.items():
        if key in old and old[key] == value:
            continue
        if isinstance(value, dict) and isinstance(old.get(key), dict):
            patch[key] = merge_patch(old[key], value)
        else:
            patch[key] = value
    return patch


async def apply(api: kube.Kube, cache: ClusterCache, job: dict, pods: tuple[PodView, ...], actions: list[Action],
                creates: CreateRetries, memory: ApiMemory) -> float | None:
    """Executes the pass's actions but DeleteRendezvousKeys (job_pass.py starts that outside the
    pass); returns when to look again (None: no need). What it creates goes into ``cache`` from
    the create's answer (ClusterCache.offer)."""
    namespace = job["metadata"]["namespace"]
    uids = {p.name: p.uid or None for p in pods}
    # The policy first, and no pod unless it went through (decide/isolation.py): a pod never runs
    # unisolated for want of a round trip.
    isolated = True
    for action in actions:
        if isinstance(action, (CreateNetworkPolicy, PatchNetworkPolicy)):
            isolated = await _write_network_policy(api, cache, namespace, action, memory) and isolated
    bodies = [a.body for a in actions if isinstance(a, CreateService)
              or (isinstance(a, CreatePod) and isolated)]
    writes, requeue = [_create(api, cache, (namespace, job["metadata"]["name"]), bodies, creates)], None
    for action in actions:
        if isinstance(action, (CreateDisruptionBudget, PatchDisruptionBudget, DeleteDisruptionBudget)):
            writes.append(_write_disruption_budget(api, cache, namespace, action, memory))
        elif isinstance(action, DeletePod):
            logger.info("Deleting pod %s/%s: %s", namespace, action.name, action.reason)
            writes.append(api.delete_or_skip("Pod", namespace, action.name, uids.get(action.name),
                                             grace_period_seconds=action.grace_period_seconds))
        elif isinstance(action, DeleteJob):
            logger.info("Deleting DDPJob %s/%s: %s", namespace, job["metadata"]["name"], action.reason)
            writes.append(api.delete_job(namespace, job["metadata"]["name"], job["metadata"]["uid"]))
        elif isinstance(action, Requeue):
            requeue = action.after
    create_requeue, *_ = await asyncio.gather(*writes)  # independent objects: one round trip, not one per pod
    return min((r for r in (requeue, create_requeue) if r is not None), default=None)


async def _write_network_policy(api: kube.Kube, cache: ClusterCache, namespace: str,
                                action: CreateNetworkPolicy | PatchNetworkPolicy, memory: ApiMemory) -> bool:
    """Create-or-skip, or put the spec back; False when the pass must create no pod (someone
    else's policy has the name: the next passes report it, from ``memory``). Without the grant
    to create (403) the job runs without one, as when it cannot be read, and the next pass's
    condition says so."""
    try:
        if isinstance(action, PatchNetworkPolicy):
            logger.info("Putting back the spec of NetworkPolicy %s/%s", namespace, action.name)
            await api.patch_or_skip("NetworkPolicy", namespace, action.name,
                                    {"spec": merge_patch(action.observed, action.wanted)})
            return True
        await _create_and_keep(api, cache, action.body, namespace)
        memory.policy_created((namespace, action.body["metadata"]["name"]))
    except kube.ForeignObjectError as e:
        logger.warning("Not creating the NetworkPolicy in %s: %s", namespace, e.api_message)
        memory.met_foreign_policy((namespace, action.body["metadata"]["name"]))
        return False
    except kube.ApiError as e:
        if e.status != 403:
            raise
        memory.policy_create_forbidden(namespace)
        memory.warn_missing_grant("NetworkPolicy", namespace, NO_POLICY_GRANT, namespace, e)
    return True


async def _write_disruption_budget(api: kube.Kube, cache: ClusterCache, namespace: str, action: CreateDisruptionBudget
                                   | PatchDisruptionBudget | DeleteDisruptionBudget, memory: ApiMemory) -> None:
    """Create-or-skip, patch-or-skip or delete-or-skip the budget; without the grant (403) the job runs without one."""
    try:
        if isinstance(action, CreateDisruptionBudget):
            await _create_and_keep(api, cache, action.body, namespace)
        elif isinstance(action, PatchDisruptionBudget):
            await api.patch_or_skip("PodDisruptionBudget", namespace, action.name, action.patch)
        else:
            await api.delete_or_skip("PodDisruptionBudget", namespace, action.name)
    except kube.ForeignObjectError as e:  # someone else's budget of that name: the job goes without one
        logger.warning("Not managing the PodDisruptionBudget of %s: %s", namespace, e.api_message)
    except kube.ApiError as e:
        if e.status != 403:
            raise
        memory.warn_missing_grant("PodDisruptionBudget", namespace, NO_BUDGET_GRANT, namespace, e)


async def _create(api: kube.Kube, cache: ClusterCache, key: JobKey, bodies: list[dict],
                  creates: CreateRetries) -> float | None:
    """Creates ``bodies`` unless the job's creates back off; returns when to look again (None: no need).

    A refusal is kept in ``creates`` for the next pass to report, and that pass comes at once
    (its creates still wait); success, or nothing left to create, clears it.
    """
    reported, requeue = creates.last(key), None
    if bodies and creates.hold(key) > 0:
        return creates.hold(key)
    refused = await _create_in_waves(api, cache, key[0], bodies) if bodies else None
    if refused is None:
        creates.succeeded(key)
    else:
        failure, retry_after = refused
        requeue = creates.failed(key, failure, retry_after)
        logger.warning("Creating %s %s/%s failed (HTTP %s %s: %s); the job's creates wait %.0f s",
                       failure.kind, key[0], failure.name, failure.code, failure.reason, failure.message, requeue)
    if creates.last(key) != reported:
        requeue = COALESCE_SECONDS  # the next pass reports the change
    return requeue


async def _create_in_waves(api: kube.Kube, cache: ClusterCache, namespace: str,
                           bodies: list[dict]) -> tuple[CreateFailure, float | None] | None:
    """Creates in waves of 1, 2, 4, ... (the ReplicaSet controller's slow start) and stops at
    the first wave with a refusal: a quota that refuses one pod refuses the rest, and costs one
    request, not a hundred. Returns the first refusal (in the plan's order) and its Retry-After."""
    done, size = 0, 1
    while done < len(bodies):
        wave = bodies[done:done + size]
        outcomes = await asyncio.gather(*(_create_one(api, cache, namespace, body) for body in wave))
        refused = next((o for o in outcomes if o is not None), None)
        if refused is not None:
            return refused
        done, size = done + len(wave), size * 2
    return None


async def _create_one(api: kube.Kube, cache: ClusterCache, namespace: str,
                      body: dict) -> tuple[CreateFailure, float | None] | None:
    try:
        await _create_and_keep(api, cache, body, namespace)
    except (kube.ApiError, kube.RetryableError) as e:
        failure = CreateFailure(body["kind"], body["metadata"]["name"], e.status, e.reason, e.api_message)
        return failure, e.retry_after
    return None


async def _create_and_keep(api: kube.Kube, cache: ClusterCache, body: dict, namespace: str) -> None:
    """Create-or-skip, and the created object into the cache at once (ClusterCache.offer)."""
    created = await api.create_or_skip(body, namespace)
    if created:
        cache.offer(created)
