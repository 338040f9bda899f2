"""Plan: compare the desired pods of a job with the observed ones and list the actions.

Pure: `plan_actions` returns typed actions that `kube.py` executes (create-or-skip
on 409, delete-or-skip on 404), so a plan that is repeated is harmless.

Rules, in order:
  * invalid spec: nothing (the status reports InvalidSpec; pods are left alone);
  * finished (Succeeded/Failed): delete pods per runPolicy.cleanPodPolicy, then
    delete the job runPolicy.ttlSecondsAfterFinished after completionTime;
  * suspended: delete every pod;
  * otherwise: create the Service when missing, and the NetworkPolicy when
    spec.networkPolicy.enabled and it is missing; delete pods with index >= replicas
    (scale-down removes the highest indexes, never node 0, the c10d host); delete
    failed pods and re-create them under the same name once the backoff after the
    current failure incident has elapsed and the old pod is gone; create the
    missing indexes; create nothing once a node succeeded (training is over and
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

from ddpjob_operator.decide import capacity, topology
from ddpjob_operator.api import constants as C
from ddpjob_operator.api.clock import parse_time, seconds_between
from ddpjob_operator.api.names import pod_name
from ddpjob_operator.decide.observed import current_pods, is_active, is_deleting, pod_index, pod_name_of, pod_phase
from ddpjob_operator.decide.observed import is_store_pod
from ddpjob_operator.render.store_pod import render_store_pod, render_store_service
from ddpjob_operator.render.node_pod import render_pod, render_service
from ddpjob_operator.render.network_policy import OperatorPeer, render_network_policy
from ddpjob_operator.api.spec import DDPJobSpec, JobRef
from ddpjob_operator.decide.actions import Action, CreateNetworkPolicy, CreatePod, CreateService, DeleteJob, DeletePod
from ddpjob_operator.decide.actions import Requeue
from ddpjob_operator.decide.budget import replacement_delay

DELETION_POLL_SECONDS = 2.0  # how soon to look again while a pod with a wanted name terminates














def plan_actions(ref: JobRef, spec: DDPJobSpec | None, status: Mapping[str, Any],
                 pods: Iterable[Mapping[str, Any]], now: datetime, *,
                 service_exists: bool, network_policy_exists: bool | None = None,
                 operator: OperatorPeer = OperatorPeer()) -> list[Action]:
    """The actions that move the cluster toward the spec.

    Args:
        ref: the job's identity.
        spec: the parsed spec; None when invalid (no actions).
        status: the status computed for this pass by status.compute_status (phase,
            restarts, lastFailureTime, completionTime, startTime, rendezvousGeneration).
        pods: the job's observed pods.
        now: the current time.
        service_exists: whether the job's Service was observed.
        network_policy_exists: whether the job's NetworkPolicy was observed; None when it was
            not looked for (then none is planned).
        operator: the operator's pods, whom the NetworkPolicy lets read the progress port.
    """
    pods = list(pods)
    if spec is None:
        return []
    phase = status.get("phase")
    if phase in C.FINISHED_PHASES:
        return _finished(spec, status, pods, now)
    if phase == C.PHASE_SUSPENDED or spec.run_policy.suspend:
        return [DeletePod(pod_name_of(p), "the job is suspended") for p in pods if not is_deleting(p)]
    actions: list[Action] = [] if service_exists else [CreateService(render_service(ref, spec))]
    actions += _network_policy(ref, spec, network_policy_exists, operator)
    generation = topology.generation_of(status)
    stale = [p for p in pods if topology.is_stale(p, generation)]
    actions += [DeletePod(pod_name_of(p), f"a whole-group restart began rendezvous generation {generation}")
                for p in stale if not is_deleting(p)]
    pods = topology.without_stale(pods, generation)
    actions += _scale_down(spec, pods)
    actions += _replace_failed(spec, pods)
    actions += _store(ref, spec, pods)
    if stale or (spec.elastic_policy.store_on_pod and topology.store_pod(pods) is None):
        actions.append(Requeue(DELETION_POLL_SECONDS))  # the old group goes, or the store comes, first
    else:
        actions += _create_missing(ref, spec, status, pods, now)
    actions += _pending_requeue(spec, pods, now)
    return _with_one_requeue(actions + _deadline_requeue(spec, status, now))


def _network_policy(ref: JobRef, spec: DDPJobSpec, exists: bool | None, operator: OperatorPeer) -> list[Action]:
    """Create-or-skip, like the Service: created while the job runs, never deleted (the job owns it)."""
    if exists is None or exists or not spec.network_policy.enabled:
        return []
    return [CreateNetworkPolicy(render_network_policy(ref, operator))]


def _finished(spec: DDPJobSpec, status: Mapping[str, Any], pods: list[Mapping[str, Any]],
              now: datetime) -> list[Action]:
    policy = spec.run_policy.clean_pod_policy
    doomed = [p for p in pods if not is_deleting(p)
              and (policy == "All" or (policy == "Running" and is_active(p)) or (is_store_pod(p) and is_active(p)))]
    actions: list[Action] = [DeletePod(pod_name_of(p), f"the job finished (cleanPodPolicy {policy})")
                             for p in doomed]
    ttl, done = spec.run_policy.ttl_seconds_after_finished, parse_time(status.get("completionTime"))
    if ttl is not None and done is not None:
        left = ttl - seconds_between(done, now)
        actions.append(DeleteJob(f"ttlSecondsAfterFinished ({ttl}) passed") if left <= 0 else Requeue(left))
    return actions


def _scale_down(spec: DDPJobSpec, pods: list[Mapping[str, Any]]) -> list[Action]:
    extra = [p for p in pods if not is_deleting(p) and not is_store_pod(p)
             and (pod_index(p) is None or pod_index(p) >= spec.desired_replicas)]
    return [DeletePod(pod_name_of(p), f"node index is not below spec.replicas ({spec.desired_replicas})")
            for p in sorted(extra, key=lambda p: -(pod_index(p) or 0))]


def _replace_failed(spec: DDPJobSpec, pods: list[Mapping[str, Any]]) -> list[Action]:
    if _training_over(spec, pods):
        return []
    return [DeletePod(pod_name_of(p), "replacing a failed node pod")
            for p in current_pods(pods, spec.desired_replicas) if pod_phase(p) == "Failed"]


def _training_over(spec: DDPJobSpec, pods: list[Mapping[str, Any]]) -> bool:
    return any(pod_phase(p) == "Succeeded" for p in current_pods(pods, spec.desired_replicas))


def _create_missing(ref: JobRef, spec: DDPJobSpec, status: Mapping[str, Any],
                    pods: list[Mapping[str, Any]], now: datetime) -> list[Action]:
    if _training_over(spec, pods):
        return []
    taken = {pod_name_of(p) for p in pods}  # a name is reusable only once the old pod is gone
    missing = [i for i in range(spec.desired_replicas) if pod_name(ref.name, i) not in taken]
    failed = [p for p in current_pods(pods, spec.desired_replicas) if pod_phase(p) == "Failed"]
    waiting_for_deletion = any(is_deleting(p) for p in pods) or bool(failed)
    delay = replacement_delay(spec, status, now)
    if missing and delay > 0:
        return [Requeue(delay)]
    generation = topology.generation_of(status)
    actions: list[Action] = [CreatePod(render_pod(ref, spec, i, generation)) for i in missing]
    if waiting_for_deletion:
        actions.append(Requeue(max(delay, DELETION_POLL_SECONDS)))
    return actions


def _store(ref: JobRef, spec: DDPJobSpec, pods: list[Mapping[str, Any]]) -> list[Action]:
    """Create the dedicated store pod (and its Service, create-or-skip) when there is none;
    delete a failed one (topology.py already turned its loss into a group restart)."""
    if not spec.elastic_policy.store_on_pod or _training_over(spec, pods):
        return []
    stores = [p for p in pods if is_store_pod(p)]
    actions: list[Action] = [DeletePod(pod_name_of(p), "replacing the failed rendezvous store pod")
                             for p in stores if not is_deleting(p) and pod_phase(p) in ("Failed", "Succeeded")]
    if not stores:
        actions += [CreateService(render_store_service(ref, spec)), CreatePod(render_store_pod(ref, spec))]
    return actions


def _pending_requeue(spec: DDPJobSpec, pods: list[Mapping[str, Any]], now: datetime) -> list[Action]:
    """Look again when a waiting node pod passes scheduling.pendingTimeoutSeconds."""
    after = capacity.next_overdue_in(spec, current_pods(pods, spec.desired_replicas), now)
    return [Requeue(after)] if after is not None else []


def _deadline_requeue(spec: DDPJobSpec, status: Mapping[str, Any], now: datetime) -> list[Action]:
    deadline, started = spec.run_policy.active_deadline_seconds, parse_time(status.get("startTime"))
    if not deadline or started is None:
        return []
    return [Requeue(max(deadline - seconds_between(started, now), 0.0))]


def _with_one_requeue(actions: list[Action]) -> list[Action]:
    requeues = [a.after for a in actions if isinstance(a, Requeue)]
    rest = [a for a in actions if not isinstance(a, Requeue)]
    return rest + ([Requeue(min(requeues))] if requeues else [])
