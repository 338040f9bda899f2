"""kopf wiring: which events start a reconciliation pass of which DDPJob.

A pass only observes and applies; every decision is made by the pure ``decide.reconcile``
(observed state -> status, Events and actions) and every API call goes through ``kube``. A pass:

1. reads the job, its pods and whether its Service exists from the cache (cache.py: fed by
   watches, never older than our own last status write), so a steady-state pass makes no
   LIST and no GET;
2. writes the status once, when it changed, *before* acting, so a failure that is about to be
   replaced is counted durably even if the operator dies right after;
3. executes the actions (create-or-skip, delete-or-skip); creates go in waves of 1, 2, 4, ...
   that stop at the first refusal, and a refused create is kept for the next pass, which
   reports it (PodCreateFailed), while the job's creates back off (backoff.CreateRetries);
4. posts the Events the status computation returned (only when something changed).

After a pass that left an etcd-v3 job finished, its rendezvous keys are deleted (etcd_cleanup);
etcd-v3 jobs also carry a kopf finalizer that deletes them on deletion, bounded so it never
blocks the deletion. A job's managed etcd (managed_etcd) is observed in the pass like its Service,
and so is its NetworkPolicy (render/network_policy.py), unless the job turned it off, and its
PodDisruptionBudget (render/pdb.py).

Passes of one job never overlap (one lock per job), at most --max-concurrent-passes run at
once, and pod events (from the cache's watch) are coalesced so that a job creating 8 pods is
reconciled a couple of times, not 8. kopf cannot retry watch-event
handlers, so a planned requeue (backoff end, deadline, TTL) is an in-memory timer; a restarted
operator re-plans every job from its ``@kopf.on.resume`` handler, so nothing is lost with it.
A failed pass is retried after a delay that doubles per failure in a row, per job
(backoff.Backoff), whether kopf retries it or a timer does.
"""
from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

import kopf

from ddpjob_operator.api import constants as C
from ddpjob_operator.controller import etcd_cleanup, kube, live_progress, metrics
from ddpjob_operator.controller.backoff import Backoff, CreateRetries
from ddpjob_operator.controller.cache import DISRUPTION_BUDGETS, NETWORK_POLICIES, SERVICES, ClusterCache
from ddpjob_operator.decide import managed_etcd, stuck
from ddpjob_operator.api.names import disruption_budget_name, managed_etcd_name, network_policy_name, rdzv_store_name
from ddpjob_operator.decide.actions import (
    CreateDisruptionBudget, CreateNetworkPolicy, CreatePod, CreateService, DeleteDisruptionBudget, DeleteJob,
    DeletePod, PatchDisruptionBudget, PatchNetworkPolicy, Requeue
)
from ddpjob_operator.decide.creation import CreateFailure
from ddpjob_operator.decide.observed import Observed, ObservedBudget, ObservedEtcd, ObservedPolicy, PodView, claimed
from ddpjob_operator.decide.reconcile import Reconciliation, reconcile
from ddpjob_operator.render import network_policy

logger = logging.getLogger("ddpjob_operator")

COALESCE_SECONDS = 0.05  # pod events closer together than this share one pass
POLLED_PHASES = (C.PHASE_RUNNING, C.PHASE_RESTARTING)  # phases whose pods train: their progress endpoints are read

JobKey = tuple[str, str]  # (namespace, name)


@dataclasses.dataclass(frozen=True)
class PassOutcome:
    """What the wiring needs to know after a pass."""

    requeue: float | None = None  # look again after this many seconds even without an event
    invalid: str = ""  # why the spec is invalid ("" when valid): retrying will not help
    gone: bool = False  # the job was deleted: drop its timers and lock


@dataclasses.dataclass(frozen=True)
class PassSettings:
    """The operator's flags (main.py) that a pass needs."""

    progress_poll: float = C.PROGRESS_POLL_SECONDS  # --progress-poll-seconds (0: never)
    operator: network_policy.OperatorPeer = network_policy.OperatorPeer()  # --operator-pod-selector/-namespace
    max_replicas: int | None = C.DEFAULT_MAX_REPLICAS  # --max-replicas (None: no cap)


class JobPasses:
    """Serialises, coalesces and schedules the passes of each job, at most ``limit`` at once.

    The limit is a first-come, first-served semaphore and a job waits in it at most once
    (pokes while it waits share its pass), so a busy job cannot starve the others and a
    burst of 1,000 new jobs runs ``limit`` passes at a time instead of 1,000.
    """

    def __init__(self, run: Callable[[JobKey], Awaitable[PassOutcome]], errors: Backoff | None = None,
                 limit: int = kube.DEFAULT_CONCURRENT_PASSES):
        self._run = run
        self.errors = errors or Backoff()  # failed passes in a row, per job
        self._slots = asyncio.Semaphore(limit)
        self._locks: dict[JobKey, asyncio.Lock] = {}
        self._queued: set[JobKey] = set()
        self._timers: dict[JobKey, asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Task] = set()

    async def run_now(self, key: JobKey, on_start: Callable[[], None] | None = None) -> PassOutcome:
        """One pass, awaited, so that kopf sees its errors; ``on_start`` is called when it has its
        turn (the job's lock and a slot).

        Raises:
            kopf.TemporaryError: the pass failed; its delay doubles with each failure in a row
                of this job (and honours a Retry-After), so kopf's retry backs off.
        """
        async with self._locks.setdefault(key, asyncio.Lock()), self._slots:
            if on_start is not None:
                on_start()
            try:
                outcome = await self._run(key)
            except Exception as e:
                delay = self.errors.failed(key, getattr(e, "retry_after", None))
                raise kopf.TemporaryError(f"{e} (failure {self.errors.failures(key)} in a row, retrying in "
                                          f"{delay:.0f}s)", delay=delay) from e
        self.errors.succeeded(key)
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
        waiting = self.errors.remaining(key)
        if waiting > 0:  # the job's last pass failed: events meanwhile wait for its retry
            self._queued.discard(key)
            self.schedule(key, waiting)
            return
        try:
            # Pokes share this pass until it starts (waiting for a slot included); a poke
            # after that is an event the pass may have missed, and queues the next one.
            await self.run_now(key, on_start=lambda: self._queued.discard(key))
        except kopf.TemporaryError as e:  # nobody awaits a poked pass: log it and try again later
            logger.warning("Reconciling %s/%s failed: %s", *key, e)
            self.schedule(key, e.delay)


async def run_pass(api: kube.Kube, cache: ClusterCache, key: JobKey,
                   cleaner: etcd_cleanup.RendezvousCleaner | None = None,
                   settings: PassSettings = PassSettings(), creates: CreateRetries | None = None) -> PassOutcome:
    """One pass over one job, observed from ``cache``; a finished etcd-v3 job's rendezvous keys
    are deleted after it.

    While the job runs, the pass reads one node's progress endpoint (live_progress) and
    comes back every ``settings.progress_poll`` seconds (0: never) to read it again.
    ``creates`` keeps the job's last refused create and its backoff from pass to pass.
    """
    namespace, name = key
    creates = creates if creates is not None else CreateRetries()
    progress_poll = settings.progress_poll
    await cache.synced()
    with metrics.timed_pass():
        job = cache.job(namespace, name)
        if job is None:
            metrics.observe_job(namespace, name, None)
            creates.forget(key)
            return PassOutcome(gone=True)
        observed = await _observe(api, cache, job, progress_poll)
        pods, now = observed.pods, datetime.datetime.now(datetime.timezone.utc)
        result = reconcile(job, observed, now, operator=settings.operator, create_failure=creates.last(key),
                           max_replicas=settings.max_replicas)
        await _write_status(api, cache, job, result)
        requeue = await _apply(api, job, pods, result, creates)
        await _record(api, job, result)
        if progress_poll and result.status.get("phase") in POLLED_PHASES:
            requeue = progress_poll if requeue is None else min(requeue, progress_poll)
    metrics.observe_job(namespace, name, result.status.get("phase"))
    metrics.observe_goodput(namespace, name, result.status, now)
    metrics.observe_budget(namespace, name, result.status, result.spec)
    metrics.observe_step_advanced(namespace, name, result.status)
    if cleaner is not None:  # started, not awaited: the user's etcd must not hold the pass's slot
        cleaner.after_pass(job, pods, result.status)
    return PassOutcome(requeue, "; ".join(str(e) for e in result.errors))


async def _observe(api: kube.Kube, cache: ClusterCache, job: dict, progress_poll: float) -> Observed:
    """Everything the pass decides on: the cache's pods (only those the job controls: a copied
    label claims nothing), Service, etcd and NetworkPolicy; the progress endpoint of a running
    job; the Nodes of pods stuck terminating (read from the API: rare, and not worth watching
    every Node of the cluster for)."""
    namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
    owned = claimed(cache.pods(namespace, name), name, job["metadata"].get("uid", ""))
    pods = tuple(p for p in owned if p.component != C.COMPONENT_ETCD)
    polled = bool(progress_poll) and (job.get("status") or {}).get("phase") in POLLED_PHASES
    live = await live_progress.read_live_progress(pods) if polled else []
    now = datetime.datetime.now(datetime.timezone.utc)
    return Observed(pods, bool(cache.exists(SERVICES, namespace, name)), tuple(live),
                    _observe_managed_etcd(cache, job, owned),
                    await _observe_nodes(api, stuck.nodes_to_read(pods, now)), _observe_network_policy(cache, job),
                    _observe_disruption_budget(cache, job),
                    store_service_exists=bool(cache.exists(SERVICES, namespace, rdzv_store_name(name))))


def _observe_managed_etcd(cache: ClusterCache, job: dict, owned: tuple[PodView, ...]) -> ObservedEtcd | None:
    """The job's own etcd pod and Service, when the job asks for one (see managed_etcd)."""
    if not managed_etcd.requested(job):
        return None
    pod = next((p for p in owned if p.component == C.COMPONENT_ETCD), None)
    namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
    return ObservedEtcd(pod=pod, service_exists=bool(cache.exists(SERVICES, namespace, managed_etcd_name(name))))


_NO_NETWORK_POLICY_GRANT: set[str] = set()  # namespaces already warned about (one log line each)


def _observe_network_policy(cache: ClusterCache, job: dict) -> ObservedPolicy | None:
    """The job's NetworkPolicy as the cache holds it; None when it is not wanted (turned off, job
    finished). Without the grant to list them (403) it is unreadable: the job runs without one,
    its condition and the log say so."""
    if not network_policy.requested(job) or (job.get("status") or {}).get("phase") in C.FINISHED_PHASES:
        return None
    namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
    policy_key = (namespace, network_policy_name(name))
    if cache.exists(NETWORK_POLICIES, *policy_key) is None:
        _warn_no_network_policy_grant(namespace, cache.refusal(NETWORK_POLICIES, namespace))
        return ObservedPolicy(C.POLICY_UNREADABLE)
    policy = cache.get(NETWORK_POLICIES, *policy_key)
    if policy is None and time.monotonic() - _FOREIGN_POLICIES.get(policy_key, -math.inf) < FOREIGN_POLICY_RECHECK_SECONDS:
        return ObservedPolicy(C.POLICY_FOREIGN)
    _FOREIGN_POLICIES.pop(policy_key, None)
    return ObservedPolicy.of(policy, job["metadata"].get("uid", ""), namespace in _POLICY_CREATE_REFUSED)


def _observe_disruption_budget(cache: ClusterCache, job: dict) -> ObservedBudget | None:
    """The job's PodDisruptionBudget (render/pdb.py), from the cache; None once the job finished, or
    when the operator may not list PodDisruptionBudgets (403: the job then runs without one, and
    the log says so)."""
    if (job.get("status") or {}).get("phase") in C.FINISHED_PHASES:
        return None
    namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
    budget_name = disruption_budget_name(name)
    if cache.exists(DISRUPTION_BUDGETS, namespace, budget_name) is None:
        _warn_no_budget_grant(namespace, cache.refusal(DISRUPTION_BUDGETS, namespace))
        return None
    budget = cache.get(DISRUPTION_BUDGETS, namespace, budget_name)
    return ObservedBudget.of(budget, job["metadata"].get("uid", ""))


async def _write_disruption_budget(api: kube.Kube, namespace: str, action: CreateDisruptionBudget
                                   | PatchDisruptionBudget | DeleteDisruptionBudget) -> None:
    """Create-or-skip, patch-or-skip or delete-or-skip the budget; without the grant (403) the job runs without one."""
    try:
        if isinstance(action, CreateDisruptionBudget):
            await api.create_or_skip(action.body, namespace)
        elif isinstance(action, PatchDisruptionBudget):
            await api.patch_or_skip("PodDisruptionBudget", namespace, action.name, action.patch)
        else:
            await api.delete_or_skip("PodDisruptionBudget", namespace, action.name)
    except kube.ForeignObjectError as e:  # someone else's budget of that name: the job goes without one
        logger.warning("Not managing the PodDisruptionBudget of %s: %s", namespace, e.api_message)
    except kube.ApiError as e:
        if e.status != 403:
            raise
        _warn_no_budget_grant(namespace, e)


_NO_BUDGET_GRANT: set[str] = set()  # namespaces already warned about (one log line each)


def _warn_no_budget_grant(namespace: str, error: Exception | None) -> None:
    if namespace not in _NO_BUDGET_GRANT:
        _NO_BUDGET_GRANT.add(namespace)
        logger.warning("Cannot manage PodDisruptionBudgets in %s (%s): its jobs run without one, so a drain may "
                       "evict all of a job's pods at once; grant list, watch, create, patch and delete on "
                       "policy poddisruptionbudgets (the chart does)", namespace, error)


_POLICY_CREATE_REFUSED: set[str] = set()  # namespaces whose last NetworkPolicy create was refused (403)
# Policies whose create met someone else's of that name (a 409 read back), by (namespace, name), with
# when. The cache holds only policies with the operator's labels, so an unlabelled foreign one is
# known from this alone: the job reports it (ObservedPolicy FOREIGN, its pods wait) and the create
# is tried again only after FOREIGN_POLICY_RECHECK_SECONDS: one create and one read a minute, not
# one a pass.
_FOREIGN_POLICIES: dict[tuple[str, str], float] = {}
FOREIGN_POLICY_RECHECK_SECONDS = 60.0


async def _write_network_policy(api: kube.Kube, namespace: str,
                                action: CreateNetworkPolicy | PatchNetworkPolicy) -> bool:
    """Create-or-skip, or put the spec back; False when the pass must create no pod (someone
    else's policy has the name). Without the grant to create (403) the job runs without one, as
    when it cannot be read, and the next pass's condition says so."""
    try:
        if isinstance(action, PatchNetworkPolicy):
            logger.info("Putting back the spec of NetworkPolicy %s/%s", namespace, action.name)
            await api.patch_or_skip("NetworkPolicy", namespace, action.name,
                                    {"spec": merge_patch(action.observed, action.wanted)})
            return True
        await api.create_or_skip(action.body, namespace)
        _POLICY_CREATE_REFUSED.discard(namespace)
    except kube.ForeignObjectError as e:  # someone else's: the next passes report it (_FOREIGN_POLICIES)
        logger.warning("Not creating the NetworkPolicy in %s: %s", namespace, e.api_message)
        _FOREIGN_POLICIES[(namespace, action.body["metadata"]["name"])] = time.monotonic()
        return False
    except kube.ApiError as e:
        if e.status != 403:
            raise
        _POLICY_CREATE_REFUSED.add(namespace)
        _warn_no_network_policy_grant(namespace, e)
    return True


def _warn_no_network_policy_grant(namespace: str, error: Exception | None) -> None:
    if namespace not in _NO_NETWORK_POLICY_GRANT:
        _NO_NETWORK_POLICY_GRANT.add(namespace)
        logger.warning("Cannot manage NetworkPolicies in %s (%s): its jobs run without one, so anything that "
                       "reaches their rendezvous store can run code in them; grant list, watch and "
                       "create on networking.k8s.io networkpolicies (the chart does)", namespace, error)


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


async def _write_status(api: kube.Kube, cache: ClusterCache, job: dict, result: Reconciliation) -> None:
    """One status PATCH when the status changed (none when it did not). Its answer goes into the
    cache at once, so the next pass counts from it even before the watch brings it."""
    old = job.get("status") or {}
    if result.status == old:
        return
    patched = await api.patch_job_status(job["metadata"]["namespace"], job["metadata"]["name"],
                                         merge_patch(old, result.status))
    if patched:
        cache.offer(patched)
    metrics.observe_restarts(int(old.get("restarts") or 0), int(result.status.get("restarts") or 0))
    metrics.observe_status_change(old, result.status)


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


async def _record(api: kube.Kube, job: dict, result: Reconciliation) -> None:
    """Posts the pass's Events; like kubelet and controllers, a lost Event does not fail the pass."""
    for event in result.events:
        try:
            await api.post_event(job, event.type, event.reason, event.message)
        except (kube.ApiError, kopf.TemporaryError) as e:
            logger.warning("Could not post the %s Event about %s: %s", event.reason, job["metadata"]["name"], e)


async def _apply(api: kube.Kube, job: dict, pods: tuple[PodView, ...], result: Reconciliation,
                 creates: CreateRetries) -> float | None:
    namespace = job["metadata"]["namespace"]
    uids = {p.name: p.uid or None for p in pods}
    # The policy first, and no pod unless it went through (decide/isolation.py): a pod never runs
    # unisolated for want of a round trip.
    isolated = True
    for action in result.actions:
        if isinstance(action, (CreateNetworkPolicy, PatchNetworkPolicy)):
            isolated = await _write_network_policy(api, namespace, action) and isolated
    bodies = [a.body for a in result.actions if isinstance(a, CreateService)
              or (isinstance(a, CreatePod) and isolated)]
    writes, requeue = [_create(api, (namespace, job["metadata"]["name"]), bodies, creates)], None
    for action in result.actions:
        if isinstance(action, (CreateDisruptionBudget, PatchDisruptionBudget, DeleteDisruptionBudget)):
            writes.append(_write_disruption_budget(api, namespace, action))
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


async def _create(api: kube.Kube, key: JobKey, bodies: list[dict], creates: CreateRetries) -> float | None:
    """Creates ``bodies`` unless the job's creates back off; returns when to look again (None: no need).

    A refusal is kept in ``creates`` for the next pass to report, and that pass comes at once
    (its creates still wait); success, or nothing left to create, clears it.
    """
    reported, requeue = creates.last(key), None
    if bodies and creates.hold(key) > 0:
        return creates.hold(key)
    refused = await _create_in_waves(api, key[0], bodies) if bodies else None
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


async def _create_in_waves(api: kube.Kube, namespace: str,
                           bodies: list[dict]) -> tuple[CreateFailure, float | None] | None:
    """Creates in waves of 1, 2, 4, ... (the ReplicaSet controller's slow start) and stops at
    the first wave with a refusal: a quota that refuses one pod refuses the rest, and costs one
    request, not a hundred. Returns the first refusal (in the plan's order) and its Retry-After."""
    done, size = 0, 1
    while done < len(bodies):
        wave = bodies[done:done + size]
        outcomes = await asyncio.gather(*(_create_one(api, namespace, body) for body in wave))
        refused = next((o for o in outcomes if o is not None), None)
        if refused is not None:
            return refused
        done, size = done + len(wave), size * 2
    return None


async def _create_one(api: kube.Kube, namespace: str, body: dict) -> tuple[CreateFailure, float | None] | None:
    try:
        await api.create_or_skip(body, namespace)
    except (kube.ApiError, kube.RetryableError) as e:
        failure = CreateFailure(body["kind"], body["metadata"]["name"], e.status, e.reason, e.api_message)
        return failure, e.retry_after
    return None


# ---------------------------------------------------------------------------- kopf handlers


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    return kube.login(**kwargs)


@kopf.on.startup()
async def start(memo: kopf.Memo, logger: logging.Logger, **kwargs: Any) -> None:
    info = kube.login(logger=logger, **kwargs)
    if info is None:
        raise kopf.PermanentError("no Kubernetes credentials: neither a service account nor a kubeconfig was found")
    memo.api = kube.Kube(info, kube.RateLimit(memo.get("kube_api_qps", kube.DEFAULT_QPS),
                                              memo.get("kube_api_burst", kube.DEFAULT_BURST)))
    memo.cleaner = etcd_cleanup.RendezvousCleaner(memo.api)
    settings = PassSettings(memo.get("progress_poll_seconds", C.PROGRESS_POLL_SECONDS),
                            memo.get("operator_peer", network_policy.OperatorPeer()),
                            memo.get("max_replicas", C.DEFAULT_MAX_REPLICAS))
    memo.creates = CreateRetries()
    memo.passes = JobPasses(lambda key: run_pass(memo.api, memo.cache, key, memo.cleaner, settings, memo.creates),
                            limit=memo.get("max_concurrent_passes", kube.DEFAULT_CONCURRENT_PASSES))
    # Pod, Service and NetworkPolicy events reach the job's passes through the cache's watches.
    memo.cache = ClusterCache(memo.api, memo.get("watched_namespaces", ()), poke=memo.passes.poke)
    memo.cache.start()


@kopf.on.cleanup()
async def stop(memo: kopf.Memo, **_: Any) -> None:
    await memo.cache.stop()
    memo.cleaner.close()
    await memo.api.close()


@kopf.on.resume(C.GROUP, C.VERSION, C.PLURAL)
@kopf.on.create(C.GROUP, C.VERSION, C.PLURAL)
@kopf.on.update(C.GROUP, C.VERSION, C.PLURAL)
async def job_changed(body: kopf.Body, namespace: str, name: str, memo: kopf.Memo, retry: int = 0,
                      **_: Any) -> None:
    """A job appeared, changed its spec (replicas, suspend, ...) or was found at start-up.

    kopf's copy of the job goes into the cache (when newer), which the job's own watch may not
    have brought yet. A change may fix what a refused create complained of (resources, a
    quota-sized request): its creates are tried at once, not after their backoff (kopf's own
    retries do wait).
    """
    memo.cache.offer(dict(body))
    if retry == 0 and getattr(memo, "creates", None) is not None:
        memo.creates.retry_now((namespace, name))
    outcome = await memo.passes.run_now((namespace, name))
    if outcome.invalid:  # reported in status and an Event by the pass; retrying cannot fix it
        raise kopf.PermanentError(f"invalid spec: {outcome.invalid}")


@kopf.on.delete(C.GROUP, C.VERSION, C.PLURAL, when=etcd_cleanup.needs_finalizer)
async def job_deleted(body: kopf.Body, retry: int, memo: kopf.Memo, **_: Any) -> None:
    """An etcd-v3 job is being deleted: delete its rendezvous keys (bounded; see etcd_cleanup)."""
    await memo.cleaner.on_delete(body, retry)
