"""Plan: compare the desired pods of a job with the observed ones and list the actions.

Pure: `plan_actions` returns typed actions that `kube.py` executes (create-or-skip
on 409, delete-or-skip on 404), so a plan that is repeated is harmless.

Rules, in order:
  * invalid spec: nothing (the status reports InvalidSpec; pods are left alone);
  * finished (Succeeded/Failed): delete pods per runPolicy.cleanPodPolicy, then
    delete the job runPolicy.ttlSecondsAfterFinished after completionTime;
  * suspended: delete every pod;
  * otherwise: create the Service when missing (the NetworkPolicy is isolation.py's, which
    reconcile.py puts first and whose rule holds every pod create until it exists); keep the PodDisruptionBudget (render/pdb.py)
    created and its spec current (patched on scale), or delete it when
    spec.runPolicy.podDisruptionBudget is off; delete pods with index >= replicas + spareReplicas
    (scale-down removes the highest indexes, never node 0, the store host with rdzvStore: node); delete
    failed pods and re-create them under the same name once the backoff after the
    current failure incident has elapsed and the old pod is gone; create the
    missing indexes, at most creation.MAX_CREATES_PER_PASS per pass (the rest in the next
    passes), each kept off status.avoidedNodes (avoided_nodes.py); create nothing once a node succeeded (training is over and
    torchrun cannot rejoin a closed rendezvous).
Rendezvous topology (topology.py): node pods of an older rendezvous generation are deleted
and no node pod is created while one of them is still there, so the groups never mix; with
`rdzvStore: pod` the store pod and its Service come first (node pods follow once the store
pod exists), a failed store pod is deleted and created again, and the store goes when the
job finishes whatever the cleanPodPolicy (it holds nothing worth keeping).
At most one Requeue is returned: the earliest moment something will change
without an event (backoff end, deadline, TTL, a deletion finishing).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Iterable, Mapping

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.clock import parse_time, seconds_between
from ddpjob_operator.api.job_ref import JobRef
from ddpjob_operator.api.spec import DDPJobSpec
from ddpjob_operator.api.names import disruption_budget_name
from ddpjob_operator.decide import avoided_nodes, capacity, creation, phases, straggler, topology
from ddpjob_operator.decide.actions import (
    Action, CreateDisruptionBudget, CreatePod, CreateService, DeleteDisruptionBudget, DeleteJob,
    DeletePod, PatchDisruptionBudget, Requeue, with_one_requeue
)
from ddpjob_operator.decide.budget import replacement_delay
from ddpjob_operator.decide.observed import BUDGET_COMPARED, NodeGroups, Observed, PodView
from ddpjob_operator.render import objects as wanted
from ddpjob_operator.render.pdb import BUDGETED_COMPONENTS

DELETION_POLL_SECONDS = 2.0  # how soon to look again while a pod with a wanted name terminates


def plan_actions(ref: JobRef, spec: DDPJobSpec | None, status: Mapping[str, Any],
                 observed: Observed, now: datetime) -> list[Action]:
    """The actions that move the cluster toward the spec.

    Args:
        ref: the job's identity.
        spec: the parsed spec; None when invalid (no actions).
        status: the status computed for this pass by status.compute_status (phase,
            restarts, lastFailureTime, completionTime, startTime, rendezvousGeneration).
        observed: what the pass observed (the job's pods, whether its Service exists).
        now: the current time.
    """
    if spec is None:
        return []
    if phases.finished(status):
        return _finished(spec, status, observed.pods, now)
    if status.get("phase") == C.PHASE_SUSPENDED or spec.run_policy.suspend:
        return [DeletePod(p.name, "the job is suspended") for p in observed.pods if not p.deleting]
    generation = topology.generation_of(status)
    healthy = sum(1 for p in observed.pods if p.running_ready and p.component in BUDGETED_COMPONENTS)
    # Bad nodes stay bad: every new pod keeps off status.avoidedNodes.
    objects = wanted.wanted_objects(ref, spec, generation=generation, avoid=avoided_nodes.names(status),
                                    healthy=healthy)
    service = wanted.one(objects, wanted.SERVICE)
    actions: list[Action] = [] if observed.service_exists else [CreateService(service.body())]
    actions += _disruption_budget(ref, objects, observed)
    groups = observed.of_generation(generation, spec.node_pods)
    actions += [DeletePod(p.name, f"a whole-group restart began rendezvous generation {generation}")
                for p in groups.stale if not p.deleting]
    actions += _scale_down(spec, groups)
    actions += _replace_failed(groups)
    actions += _replace_stragglers(status, groups)
    actions += _store(objects, observed, groups)
    if groups.stale or (wanted.one(objects, wanted.STORE) is not None and observed.store is None):
        actions.append(Requeue(DELETION_POLL_SECONDS))  # the old group goes, or the store comes, first
    else:
        actions += _create_missing(objects, spec, status, groups, now)
    actions += _stop_after_finish(status, groups, now)
    actions += _pending_requeue(spec, groups, now)
    return with_one_requeue(actions + _deadline_requeue(spec, status, now))


def _disruption_budget(ref: JobRef, objects: tuple[wanted.Wanted, ...], observed: Observed) -> list[Action]:
    """Create the job's PodDisruptionBudget, patch its spec when replicas or the Ready pods changed
    (or anyone edited it), delete it when spec.runPolicy.podDisruptionBudget is off; nothing when unread."""
    budget, want = observed.disruption_budget, wanted.one(objects, wanted.DISRUPTION_BUDGET)
    if budget is None:
        return []
    if want is None:
        return [DeleteDisruptionBudget(disruption_budget_name(ref.name))] if budget.spec is not None else []
    if budget.spec is None:
        return [CreateDisruptionBudget(want.body())]
    spec = want.body()["spec"]
    # Only the fields every server keeps: one before Kubernetes 1.26 drops unhealthyPodEvictionPolicy,
    # and comparing it would patch the budget on every pass.
    if any(budget.spec.get(k) != spec[k] for k in BUDGET_COMPARED):
        return [PatchDisruptionBudget(want.name, {"spec": spec})]
    return []


def _finished(spec: DDPJobSpec, status: Mapping[str, Any], pods: Iterable[PodView],
              now: datetime) -> list[Action]:
    policy = spec.run_policy.clean_pod_policy
    doomed = [p for p in pods if not p.deleting
              and (policy == "All" or (policy == "Running" and p.active) or (p.is_store and p.active))]
    actions: list[Action] = [DeletePod(p.name, f"the job finished (cleanPodPolicy {policy})") for p in doomed]
    ttl, done = spec.run_policy.ttl_seconds_after_finished, parse_time(status.get("completionTime"))
    if ttl is not None and done is not None:
        left = ttl - seconds_between(done, now)
        actions.append(DeleteJob(f"ttlSecondsAfterFinished ({ttl}) passed") if left <= 0 else Requeue(left))
    return actions


def _scale_down(spec: DDPJobSpec, groups: NodeGroups) -> list[Action]:
    return [DeletePod(p.name, f"node index is not below spec.replicas + spareReplicas ({spec.node_pods})")
            for p in sorted(groups.extra, key=lambda p: -(p.index or 0))]


def _replace_failed(groups: NodeGroups) -> list[Action]:
    if groups.training_over:
        return []
    return [DeletePod(p.name, "replacing a failed node pod") for p in groups.failed]


def _replace_stragglers(status: Mapping[str, Any], groups: NodeGroups) -> list[Action]:
    """Delete the pods status.failures lists as stragglers to replace (straggler.py); the missing
    index is then created again like any other."""
    doomed = straggler.to_replace(status.get("failures"))
    return [DeletePod(p.name, "replacing a straggler (spec.stragglerPolicy.action Replace)")
            for p in groups.current if p.uid in doomed and not p.deleting]


def _stop_after_finish(status: Mapping[str, Any], groups: NodeGroups, now: datetime) -> list[Action]:
    """Training finished: node pods still running C.FINISH_GRACE_SECONDS after the first one
    exited 0 (status.finishing.stopped, set by status.py) are deleted; until then, look again
    when the grace ends."""
    finishing = status.get("finishing") or {}
    since = parse_time(finishing.get("since"))
    if not groups.training_over or since is None:
        return []
    if finishing.get("stopped"):
        return [DeletePod(p.name, f"training finished {C.FINISH_GRACE_SECONDS:.0f}s ago and it still runs")
                for p in groups.current if p.active]
    return [Requeue(max(C.FINISH_GRACE_SECONDS - seconds_between(since, now), 0.0))]


def _create_missing(objects: tuple[wanted.Wanted, ...], spec: DDPJobSpec, status: Mapping[str, Any],
                    groups: NodeGroups, now: datetime) -> list[Action]:
    if groups.training_over:
        return []
    taken = {p.name for p in groups.live}  # a name is reusable only once the old pod is gone
    missing = [w for w in wanted.of_role(objects, wanted.NODE) if w.name not in taken]
    waiting_for_deletion = any(p.deleting for p in groups.live) or bool(groups.failed)
    delay = replacement_delay(spec, status, now)
    if missing and delay > 0:
        return [Requeue(delay)]
    batch = missing[:creation.MAX_CREATES_PER_PASS]  # rendered only when created: memory stays bounded
    actions: list[Action] = [CreatePod(w.body()) for w in batch]
    if len(batch) < len(missing):
        actions.append(Requeue(creation.BATCH_REQUEUE_SECONDS))
    if waiting_for_deletion:
        actions.append(Requeue(max(delay, DELETION_POLL_SECONDS)))
    return actions


def _store(objects: tuple[wanted.Wanted, ...], observed: Observed, groups: NodeGroups) -> list[Action]:
    """Create the dedicated store pod when there is none and its Service when that is missing;
    delete a failed one (topology.py already turned its loss into a group restart).

    The Service is decided on its own: the two are created in one wave, so an operator killed
    mid-pass can leave the pod without its Service, and the nodes would then never reach the store.
    """
    store = wanted.one(objects, wanted.STORE)
    if store is None or groups.training_over:
        return []
    actions: list[Action] = [DeletePod(p.name, "replacing the failed rendezvous store pod")
                             for p in observed.stores if not p.deleting and p.phase in ("Failed", "Succeeded")]
    if not observed.store_service_exists:
        actions.append(CreateService(wanted.one(objects, wanted.STORE_SERVICE).body()))
    if not observed.stores:
        actions.append(CreatePod(store.body()))
    return actions


def _pending_requeue(spec: DDPJobSpec, groups: NodeGroups, now: datetime) -> list[Action]:
    """Look again when a waiting node pod passes scheduling.pendingTimeoutSeconds."""
    after = capacity.next_overdue_in(spec, groups.current, now)
    return [Requeue(after)] if after is not None else []


def _deadline_requeue(spec: DDPJobSpec, status: Mapping[str, Any], now: datetime) -> list[Action]:
    deadline, started = spec.run_policy.active_deadline_seconds, parse_time(status.get("startTime"))
    if not deadline or started is None:
        return []
    return [Requeue(max(deadline - seconds_between(started, now), 0.0))]

