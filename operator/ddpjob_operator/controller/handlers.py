"""kopf wiring: which events start a reconciliation pass of which DDPJob.

A pass only observes and applies; every decision is made by the pure ``decide.reconcile``
(observed state -> status, Events and actions) and every API call goes through ``kube``. A pass:

1. reads the job, its pods and whether its Service exists (fresh, not kopf's cached body, so
   the failure bookkeeping in the status is never older than our own last write);
2. writes the status once, when it changed, *before* acting, so a failure that is about to be
   replaced is counted durably even if the operator dies right after;
3. executes the actions (create-or-skip, delete-or-skip);
4. posts the Events the status computation returned (only when something changed).

After a pass that left an etcd-v3 job finished, its rendezvous keys are deleted (etcd_cleanup);
etcd-v3 jobs also carry a kopf finalizer that deletes them on deletion, bounded so it never
blocks the deletion. A job's managed etcd (managed_etcd) is observed in the pass like its Service,
and so is its NetworkPolicy (render/network_policy.py), unless the job turned it off.

Passes of one job never overlap (one lock per job), and pod events are coalesced so that a
job creating 8 pods is reconciled a couple of times, not 8. kopf cannot retry watch-event
handlers, so a planned requeue (backoff end, deadline, TTL) is an in-memory timer; a restarted
operator re-plans every job from its ``@kopf.on.resume`` handler, so nothing is lost with it.
"""
from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import kopf

from ddpjob_operator.api import constants as C
from ddpjob_operator.controller import etcd_cleanup, kube, live_progress, metrics
from ddpjob_operator.decide import managed_etcd, stuck
from ddpjob_operator.api.names import managed_etcd_name, network_policy_name
from ddpjob_operator.decide.actions import CreateNetworkPolicy, CreatePod, CreateService, DeleteJob, DeletePod, Requeue
from ddpjob_operator.decide.observed import Observed, ObservedEtcd, PodView, claimed, view_pods
from ddpjob_operator.decide.reconcile import Reconciliation, reconcile
from ddpjob_operator.render.etcd_pod import etcd_selector
from ddpjob_operator.render.common import job_selector
from ddpjob_operator.render import network_policy

logger = logging.getLogger("ddpjob_operator")

COALESCE_SECONDS = 0.05  # pod events closer together than this share one pass
POLLED_PHASES = (C.PHASE_RUNNING, C.PHASE_RESTARTING)  # phases whose pods train: their progress endpoints are read
ERROR_RETRY_SECONDS = 2.0  # a pass started by a pod event that failed is tried again after this

JobKey = tuple[str, str]  # (namespace, name)


@dataclasses.dataclass(frozen=True)
class PassOutcome:
    """What the wiring needs to know after a pass."""

    requeue: float | None = None  # look again after this many seconds even without an event
    invalid: str = ""  # why the spec is invalid ("" when valid): retrying will not help
    gone: bool = False  # the job was deleted: drop its timers and lock


class JobPasses:
    """Serialises, coalesces and schedules the passes of each job."""

    def __init__(self, run: Callable[[JobKey], Awaitable[PassOutcome]]):
        self._run = run
        self._locks: dict[JobKey, asyncio.Lock] = {}
        self._queued: set[JobKey] = set()
        self._timers: dict[JobKey, asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Task] = set()

    async def run_now(self, key: JobKey) -> PassOutcome:
        """One pass, awaited, so that kopf sees its errors (and retries TemporaryError)."""
        async with self._locks.setdefault(key, asyncio.Lock()):
            outcome = await self._run(key)
        if outcome.gone:
            self.forget(key)
        else:
            self.schedule(key, outcome.requeue)
        return outcome

    def poke(self, key: JobKey) -> None:
        """A pass soon; several pokes within COALESCE_SECONDS share it."""
        if key in self._queued:
            return
        self._queued.add(key)
        task = asyncio.get_running_loop().create_task(self._poked(key))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def schedule(self, key: JobKey, after: float | None) -> None:
        """A pass ``after`` seconds from now, unless an earlier one is already scheduled."""
        if after is None:
            return
        loop = asyncio.get_running_loop()
        current = self._timers.get(key)
        # A timer that already fired keeps its (past) deadline: only a pending one may win.
        pending = current is not None and not current.cancelled() and current.when() > loop.time()
        if pending and current.when() <= loop.time() + after:
            return
        if current is not None:
            current.cancel()
        self._timers[key] = loop.call_later(after, self.poke, key)

    def forget(self, key: JobKey) -> None:
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        self._locks.pop(key, None)

    async def _poked(self, key: JobKey) -> None:
        await asyncio.sleep(COALESCE_SECONDS)
        self._queued.discard(key)
        try:
            await self.run_now(key)
        except Exception as e:  # nobody awaits a poked pass: log it and try again later
            logger.warning("Reconciling %s/%s failed, retrying in %s s: %s", *key, ERROR_RETRY_SECONDS, e)
            self.schedule(key, ERROR_RETRY_SECONDS)


async def run_pass(api: kube.Kube, key: JobKey,
                   cleaner: etcd_cleanup.RendezvousCleaner | None = None,
                   progress_poll: float = C.PROGRESS_POLL_SECONDS,
                   operator: network_policy.OperatorPeer = network_policy.OperatorPeer()) -> PassOutcome:
    """One pass over one job; a finished etcd-v3 job's rendezvous keys are deleted after it.

    While the job runs, the pass reads one node's progress endpoint (live_progress) and
    comes back every ``progress_poll`` seconds (0: never) to read it again.
    """
    namespace, name = key
    with metrics.timed_pass():
        job = await api.get_job(namespace, name)
        if job is None:
            metrics.observe_job(namespace, name, None)
            return PassOutcome(gone=True)
        # Read once, for every decision; only pods the job controls (a copied label claims nothing).
        pods = claimed(view_pods(await api.list_pods(namespace, job_selector(name))), job["metadata"].get("uid", ""))
        service_exists = await api.exists("Service", namespace, name)
        polled = bool(progress_poll) and (job.get("status") or {}).get("phase") in POLLED_PHASES
        live = await live_progress.read_live_progress(pods) if polled else []
        now = datetime.datetime.now(datetime.timezone.utc)
        observed = Observed(pods, service_exists, tuple(live), await _observe_managed_etcd(api, namespace, name, job),
                            await _observe_nodes(api, stuck.nodes_to_read(pods, now)),
                            await _observe_network_policy(api, namespace, name, job))
        result = reconcile(job, observed, now, operator=operator)
        await _write_status(api, job, result)
        requeue = await _apply(api, job, pods, result)
        await _record(api, job, result)
        if progress_poll and result.status.get("phase") in POLLED_PHASES:
            requeue = progress_poll if requeue is None else min(requeue, progress_poll)
    metrics.observe_job(namespace, name, result.status.get("phase"))
    metrics.observe_goodput(namespace, name, result.status, now)
    if cleaner is not None:  # outside the pass timer: an unreachable etcd may take a while
        await cleaner.after_pass(job, pods, result.status)
    return PassOutcome(requeue, "; ".join(str(e) for e in result.errors))


async def _observe_managed_etcd(api: kube.Kube, namespace: str, name: str,
                                job: dict) -> ObservedEtcd | None:
    """The job's own etcd pod and Service, when the job asks for one (see managed_etcd)."""
    if not managed_etcd.requested(job):
        return None
    pods = claimed(view_pods(await api.list_pods(namespace, etcd_selector(name))), job["metadata"].get("uid", ""))
    return ObservedEtcd(
        pod=pods[0] if pods else None,
        service_exists=await api.exists("Service", namespace, managed_etcd_name(name)))


_NO_NETWORK_POLICY_GRANT: set[str] = set()  # namespaces already warned about (one log line each)


async def _observe_network_policy(api: kube.Kube, namespace: str, name: str, job: dict) -> bool | None:
    """Whether the job's NetworkPolicy exists; None when it is not wanted (turned off, job finished)
    or the operator may not read NetworkPolicies (403: the job then runs without one, and the log says so)."""
    if not network_policy.requested(job) or (job.get("status") or {}).get("phase") in C.FINISHED_PHASES:
        return None
    try:
        return await api.exists("NetworkPolicy", namespace, network_policy_name(name))
    except kube.ApiError as e:
        if e.status != 403:
            raise
        _warn_no_network_policy_grant(namespace, e)
        return None


async def _create_network_policy(api: kube.Kube, body: dict, namespace: str) -> None:
    """create_or_skip; without the grant to create (403) the job runs without one, as when it cannot be read."""
    try:
        await api.create_or_skip(body, namespace)
    except kube.ApiError as e:
        if e.status != 403:
            raise
        _warn_no_network_policy_grant(namespace, e)


def _warn_no_network_policy_grant(namespace: str, error: kube.ApiError) -> None:
    if namespace not in _NO_NETWORK_POLICY_GRANT:
        _NO_NETWORK_POLICY_GRANT.add(namespace)
        logger.warning("Cannot manage NetworkPolicies in %s (%s): its jobs run without one, so anything that "
                       "reaches their rendezvous store can run code in them; grant get and create on "
                       "networking.k8s.io networkpolicies (the chart does)", namespace, error)


async def _observe_nodes(api: kube.Kube, names: list[str]) -> dict[str, dict | None]:
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


async def _write_status(api: kube.Kube, job: dict, result: Reconciliation) -> None:
    old = job.get("status") or {}
    if result.status == old:
        return
    await api.patch_job_status(job["metadata"]["namespace"], job["metadata"]["name"], merge_patch(old, result.status))
    metrics.observe_restarts(int(old.get("restarts") or 0), int(result.status.get("restarts") or 0))
    metrics.observe_status_change(old, result.status)


def merge_patch(old: dict, new: dict) -> dict:
    """The JSON merge patch (RFC 7386) from ``old`` to ``new``: removed keys become null, at any depth."""
    patch = {key: None for key in old if key not in new}
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(old.get(key), dict):
            patch[key] = merge_patch(old[key], value)
        else:
            patch[key] = value
    return patch


async def _record(api: kube.Kube, job: dict, result: Reconciliation) -> None:
    """Posts the pass's Events; like kubelet and controllers, a lost Event does not fail the pass."""
    for event in result.events:
        try:
            await api.post_event(job, event.type, event.reason, event.message)
        except (kube.ApiError, kopf.TemporaryError) as e:
            logger.warning("Could not post the %s Event about %s: %s", event.reason, job["metadata"]["name"], e)


async def _apply(api: kube.Kube, job: dict, pods: tuple[PodView, ...], result: Reconciliation) -> float | None:
    namespace = job["metadata"]["namespace"]
    uids = {p.name: p.uid or None for p in pods}
    writes, requeue = [], None
    for action in result.actions:
        if isinstance(action, (CreatePod, CreateService)):
            writes.append(api.create_or_skip(action.body, namespace))
        elif isinstance(action, CreateNetworkPolicy):
            writes.append(_create_network_policy(api, action.body, namespace))
        elif isinstance(action, DeletePod):
            logger.info("Deleting pod %s/%s: %s", namespace, action.name, action.reason)
            writes.append(api.delete_or_skip("Pod", namespace, action.name, uids.get(action.name),
                                             grace_period_seconds=action.grace_period_seconds))
        elif isinstance(action, DeleteJob):
            logger.info("Deleting DDPJob %s/%s: %s", namespace, job["metadata"]["name"], action.reason)
            writes.append(api.delete_job(namespace, job["metadata"]["name"], job["metadata"]["uid"]))
        elif isinstance(action, Requeue):
            requeue = action.after
    await asyncio.gather(*writes)  # independent objects: one round trip instead of one per pod
    return requeue


# ---------------------------------------------------------------------------- kopf handlers


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    return kube.login(**kwargs)


@kopf.on.startup()
async def start(memo: kopf.Memo, logger: logging.Logger, **kwargs: Any) -> None:
    info = kube.login(logger=logger, **kwargs)
    if info is None:
        raise kopf.PermanentError("no Kubernetes credentials: neither a service account nor a kubeconfig was found")
    memo.api = kube.Kube(info)
    memo.cleaner = etcd_cleanup.RendezvousCleaner(memo.api)
    poll = memo.get("progress_poll_seconds", C.PROGRESS_POLL_SECONDS)
    operator = memo.get("operator_peer", network_policy.OperatorPeer())
    memo.passes = JobPasses(lambda key: run_pass(memo.api, key, memo.cleaner, poll, operator))


@kopf.on.cleanup()
async def stop(memo: kopf.Memo, **_: Any) -> None:
    await memo.api.close()


@kopf.on.resume(C.GROUP, C.VERSION, C.PLURAL)
@kopf.on.create(C.GROUP, C.VERSION, C.PLURAL)
@kopf.on.update(C.GROUP, C.VERSION, C.PLURAL)
async def job_changed(namespace: str, name: str, memo: kopf.Memo, **_: Any) -> None:
    """A job appeared, changed its spec (replicas, suspend, ...) or was found at start-up."""
    outcome = await memo.passes.run_now((namespace, name))
    if outcome.invalid:  # reported in status and an Event by the pass; retrying cannot fix it
        raise kopf.PermanentError(f"invalid spec: {outcome.invalid}")


@kopf.on.delete(C.GROUP, C.VERSION, C.PLURAL, when=etcd_cleanup.needs_finalizer)
async def job_deleted(body: kopf.Body, retry: int, memo: kopf.Memo, **_: Any) -> None:
    """An etcd-v3 job is being deleted: delete its rendezvous keys (bounded; see etcd_cleanup)."""
    await memo.cleaner.on_delete(body, retry)


@kopf.on.event("", "v1", "pods", labels={C.LABEL_MANAGED_BY: C.MANAGED_BY, C.LABEL_JOB_NAME: kopf.PRESENT})
async def pod_changed(namespace: str, labels: kopf.Labels, memo: kopf.Memo, **_: Any) -> None:
    """A node pod was created, changed phase or went away: its job needs a look."""
    memo.passes.poke((namespace, labels[C.LABEL_JOB_NAME]))


@kopf.on.event("", "v1", "pods", labels={C.LABEL_MANAGED_BY: C.MANAGED_BY, C.LABEL_COMPONENT: C.COMPONENT_ETCD})
async def etcd_pod_changed(namespace: str, labels: kopf.Labels, memo: kopf.Memo, **_: Any) -> None:
    """A job's managed etcd pod changed (it lacks the job-name label; its instance label names the job)."""
    memo.passes.poke((namespace, labels[C.LABEL_INSTANCE]))
