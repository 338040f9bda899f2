"""What the operator observes, kept from watches so that a pass reads memory, not the API server.

Each pass used to GET its job, LIST its pods by label and GET its Service; the API server
answers a label-selector LIST by filtering every pod it holds, so passes (one per job) times
list cost (all pods) grew with the square of the cluster (issue 17: 10x the jobs cost 79x the
time). Here each watched kind is listed once and then watched, as client-go's informers do,
and a pass reads the cache; a steady-state pass makes no LIST and no GET.

A watched kind is one ``Watched`` entry in ``WATCHED`` (plural, apiVersion, label selector, what
is kept of each object, which job it belongs to); adding one (as the PodDisruptionBudget was) is
one entry there, a read of ``ClusterCache.get``/``exists`` in the pass, and its list/watch RBAC
in the chart.

What the cache lags behind, and why that is safe:

* a pass may plan a pod the cache has not seen yet: its create is skipped on 409
  (kube.create_or_skip), so a lagging cache never duplicates a pod; what the operator created
  itself is in the cache from the create's answer (``offer``), so that happens only after a
  restart or for another replica's creates;
* a pass deletes by the uid it saw (kube.delete_or_skip's precondition), so it never removes
  a newer pod of the same name;
* a job's status comes from the newest of the watch, kopf's body and our own PATCH's answer
  (``offer`` keeps the higher resourceVersion), so a pass never counts from a status older
  than its own last write;
* a watch that expires (410 Gone: the server compacted the events it would resume from)
  re-lists and replaces that namespace's objects, so what was deleted meanwhile goes too;
* passes wait until every watch has listed once (``synced``): a pass on an empty cache at
  start-up would take every pod for missing.

Pods are kept as ``PodView`` (parsed once per event, not once per pass): 8,000 pod dicts would
not fit the chart's memory limit, their views do. Other kinds keep only what a pass reads.

Every kind but the DDPJobs is listed and watched with the label selector ``OURS``, sent to the
API server, which filters before it answers: an object the operator did not make (a tenant's
PodDisruptionBudget with a 644 KiB selector, say) never reaches it, not even to be dropped. kopf
itself watches only DDPJobs (handlers.py registers no other kind).
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ddpjob_operator.api import constants as C
from ddpjob_operator.controller import kube
from ddpjob_operator.decide.observed import BUDGET_COMPARED, PodView, controller_of, view_pod

logger = logging.getLogger("ddpjob_operator")

WATCH_SECONDS = 300  # the server ends each watch after this; it resumes from the last resourceVersion
# A deleted object's tombstone keeps out a late, older copy of it (kopf's handler body, a PATCH's
# answer), which arrives within a pass; it is dropped after this long or once a kind holds this
# many, oldest first. Kept until the next relist instead, they grew by ~200 bytes per deletion:
# ~200 MB per million pod deletions in an operator that ran for weeks.
TOMBSTONE_SECONDS = 600.0
MAX_TOMBSTONES = 4096
RETRY_SECONDS = 5.0  # after a failed list or watch (server down, 403): wait, then list again
OURS = f"{C.LABEL_MANAGED_BY}={C.MANAGED_BY}"  # everything the operator creates carries this label

ObjectKey = tuple[str, str]  # (namespace, name)
Poke = Callable[[ObjectKey], None]  # asks for a pass of the job (namespace, job name)


def _instance(obj: Mapping[str, Any]) -> str | None:
    """The job an object belongs to: node, store and etcd pods all carry it in the instance label."""
    return ((obj.get("metadata") or {}).get("labels") or {}).get(C.LABEL_INSTANCE)


def _own_name(obj: Mapping[str, Any]) -> str | None:
    return (obj.get("metadata") or {}).get("name")


@dataclasses.dataclass(frozen=True)
class Watched:
    """One kind the operator watches.

    Attributes:
        plural, api_version: where it lives (kube.object_path).
        selector: the label selector of the list and watch ("" for all).
        keep: what is kept of each object (memory: only what a pass reads).
        job_of: the job (name) an object belongs to; its events ask for a pass of that job.
            None: events ask for no pass (a job's own events come through kopf's handlers).
        pokes_on: event types that ask for that pass.
    """

    plural: str
    api_version: str
    selector: str
    keep: Callable[[dict], Any]
    job_of: Callable[[Mapping[str, Any]], str | None] | None = None
    pokes_on: frozenset[str] = frozenset({"ADDED", "MODIFIED", "DELETED"})


# Nobody reads these from a job: kubectl's copy of the whole spec and the server's field owners,
# together often larger than the spec itself.
JOB_METADATA_DROPPED = ("managedFields",)
JOB_ANNOTATIONS_DROPPED = ("kubectl.kubernetes.io/last-applied-configuration",)
MAX_KEPT_BUDGET_FIELD_BYTES = 4096  # a budget's compared field larger than this (JSON) is not kept, only marked


def keep_job(body: dict) -> dict:
    """The job without what no pass reads (JOB_METADATA_DROPPED, JOB_ANNOTATIONS_DROPPED)."""
    meta = {k: v for k, v in (body.get("metadata") or {}).items() if k not in JOB_METADATA_DROPPED}
    if any(key in (meta.get("annotations") or {}) for key in JOB_ANNOTATIONS_DROPPED):
        meta["annotations"] = {k: v for k, v in meta["annotations"].items() if k not in JOB_ANNOTATIONS_DROPPED}
    return {**body, "metadata": meta}


def keep_budget(body: dict) -> dict:
    """What a pass reads of a budget (decide.observed.ObservedBudget.of, plan.BUDGET_COMPARED): its
    controller's uid and the compared fields. Anyone who may edit budgets in the namespace can grow
    ours (a 654 KiB selector, parsed, holds 1.1 MiB): a field over MAX_KEPT_BUDGET_FIELD_BYTES is kept as
    a short marker, which differs from what the job wants, so the pass patches it back."""
    owner = controller_of(body.get("metadata") or {})
    controller = [{"uid": owner.get("uid"), "controller": True}] if owner else []
    spec = body.get("spec") or {}
    kept = {}
    for key in BUDGET_COMPARED:
        size = len(json.dumps(spec.get(key), default=str))
        kept[key] = spec.get(key) if size <= MAX_KEPT_BUDGET_FIELD_BYTES else f"<not kept: {size} bytes>"
    return {"metadata": {"ownerReferences": controller}, "spec": kept}


JOBS = Watched(C.PLURAL, C.API_VERSION, "", keep=keep_job, job_of=_own_name, pokes_on=frozenset({"DELETED"}))
PODS = Watched("pods", "v1", OURS, keep=view_pod, job_of=_instance)
SERVICES = Watched("services", "v1", OURS, keep=lambda _: True)


def _owners_and_spec(body: Mapping[str, Any]) -> dict[str, Any]:
    return {"metadata": {"ownerReferences": (body.get("metadata") or {}).get("ownerReferences")},
            "spec": body.get("spec")}


# Only ours (the label selector goes to the API server, which filters before it answers): watching
# every budget of the cluster held each whole: 20 foreign budgets with a 654 KiB selector held 23 MiB
# after one list (tracemalloc; the issue saw 73.6 MiB in the process, and ~70 would pass the chart's
# 256Mi at every start). A same-named budget or policy someone else made without our label is
# unseen: the job's create of it then meets 409, is read back once and reported (a policy holds
# the job's pods: controller/observe.py); one that carries our label is seen, and left alone
# (ObservedBudget.of, ObservedPolicy.of).
# A pass compares the policy's and the budget's spec with the rendered one and reads their controller.
# An edit or deletion of a job's policy starts a pass of the job, which puts it back at once
# (decide/isolation.py); its creation needs none (the pass that created it goes on to the pods).
NETWORK_POLICIES = Watched("networkpolicies", C.NETWORKING_API_VERSION, OURS, keep=_owners_and_spec,
                           job_of=_instance, pokes_on=frozenset({"MODIFIED", "DELETED"}))
DISRUPTION_BUDGETS = Watched("poddisruptionbudgets", C.POLICY_API_VERSION, OURS, keep=keep_budget)
WATCHED = (JOBS, PODS, SERVICES, NETWORK_POLICIES, DISRUPTION_BUDGETS)
BY_KIND = {C.KIND: JOBS, "Pod": PODS, "Service": SERVICES, "NetworkPolicy": NETWORK_POLICIES,
           "PodDisruptionBudget": DISRUPTION_BUDGETS}


def _version(obj: Mapping[str, Any]) -> int | None:
    """resourceVersion as a number, for "which copy is newer". The API calls it opaque, but every
    server we run on (etcd's revision) makes it one increasing integer;
    when it is not, the newest arrival wins, as in a plain informer."""
    raw = (obj.get("metadata") or {}).get("resourceVersion")
    return int(raw) if isinstance(raw, str) and raw.isdigit() else None


class Store:
    """The objects of one watched kind: by (namespace, name), and by job for kinds with ``job_of``."""

    def __init__(self, kind: Watched, clock: Callable[[], float] = time.monotonic):
        self.kind = kind
        self._objects: dict[ObjectKey, tuple[int | None, str | None, Any]] = {}  # version, job, kept
        self._by_job: dict[ObjectKey, dict[str, Any]] = collections.defaultdict(dict)
        # Deleted objects' last version, and when they went, oldest first: late copies stay out.
        self._gone: dict[ObjectKey, tuple[int | None, float]] = {}
        self._clock = clock

    def __len__(self) -> int:
        return len(self._objects)

    def get(self, namespace: str, name: str) -> Any:
        entry = self._objects.get((namespace, name))
        return entry[2] if entry is not None else None

    def keys(self) -> list[ObjectKey]:
        return list(self._objects)

    def of_job(self, namespace: str, job: str) -> tuple[Any, ...]:
        """The kept objects of one job, by name (the order a LIST answers in)."""
        held = self._by_job.get((namespace, job)) or {}
        return tuple(held[name] for name in sorted(held))

    def put(self, obj: Mapping[str, Any]) -> bool:
        """Keeps ``obj`` unless a newer copy (or its deletion) is already known; True when kept."""
        meta = obj.get("metadata") or {}
        key, version = (meta.get("namespace") or "", meta.get("name") or ""), _version(obj)
        if _older(version, self._objects.get(key, (None,))[0]) or _older(version, self._gone.get(key, (-1,))[0]):
            return False
        self._gone.pop(key, None)
        self._drop(key)
        job = self.kind.job_of(obj) if self.kind.job_of is not None else None
        kept = self.kind.keep(dict(obj))
        self._objects[key] = (version, job, kept)
        if job is not None:
            self._by_job[(key[0], job)][key[1]] = kept
        return True

    def remove(self, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        key = (meta.get("namespace") or "", meta.get("name") or "")
        self._drop(key)
        self._gone.pop(key, None)  # to the end: the order is the order of deletion
        self._gone[key] = (_version(obj), self._clock())
        self._forget_old_tombstones()

    @property
    def tombstones(self) -> int:
        """Deleted objects still remembered (at most MAX_TOMBSTONES, none older than TOMBSTONE_SECONDS)."""
        self._forget_old_tombstones()
        return len(self._gone)

    def _forget_old_tombstones(self) -> None:
        oldest = self._clock() - TOMBSTONE_SECONDS
        while self._gone:
            key, (_, when) = next(iter(self._gone.items()))
            if len(self._gone) <= MAX_TOMBSTONES and when >= oldest:
                return
            del self._gone[key]

    def replace(self, namespace: str | None, objs: Iterable[Mapping[str, Any]]) -> set[ObjectKey]:
        """A fresh list of ``namespace`` (None: all) replaces what was kept there; returns the
        jobs whose objects were added, changed or dropped by it."""
        before = {key: entry for key, entry in self._objects.items() if namespace is None or key[0] == namespace}
        for key in before:
            self._drop(key)
        self._gone = {k: v for k, v in self._gone.items() if namespace is not None and k[0] != namespace}
        touched: set[ObjectKey] = set()
        for obj in objs:
            self.put(obj)
            meta = obj.get("metadata") or {}
            key = (meta.get("namespace") or "", meta.get("name") or "")
            old = before.pop(key, None)
            if old is None or old[0] != _version(obj) or old[0] is None:
                touched.add((key[0], self._objects[key][1] or ""))
        touched.update((key[0], entry[1] or "") for key, entry in before.items())
        return {job for job in touched if job[1]}

    def _drop(self, key: ObjectKey) -> None:
        entry = self._objects.pop(key, None)
        if entry is not None and entry[1] is not None:
            held = self._by_job.get((key[0], entry[1]))
            if held is not None:
                held.pop(key[1], None)
                if not held:
                    del self._by_job[(key[0], entry[1])]


def _older(version: int | None, than: int | None) -> bool:
    return version is not None and than is not None and version < than


class Expired(Exception):
    """The watch's resourceVersion is too old (410 Gone): list again."""


class ClusterCache:
    """The stores of ``WATCHED`` and the watches that feed them, in the namespaces watched
    (none given: across all namespaces, one watch per kind)."""

    def __init__(self, api: kube.Kube, namespaces: Iterable[str] = (), poke: Poke = lambda key: None,
                 kinds: Iterable[Watched] = WATCHED):
        self.api = api
        self.namespaces: tuple[str | None, ...] = tuple(namespaces) or (None,)
        self.poke = poke
        self.stores = {kind.plural: Store(kind) for kind in kinds}
        self._synced = {(kind.plural, ns): asyncio.Event() for kind in kinds for ns in self.namespaces}
        self._forbidden: dict[tuple[str, str | None], Exception] = {}  # (plural, namespace) we may not list: why
        self._tasks: list[asyncio.Task] = []

    # ------------------------------------------------------------------ what a pass reads

    def job(self, namespace: str, name: str) -> dict | None:
        return self.stores[JOBS.plural].get(namespace, name)

    def job_keys(self) -> list[ObjectKey]:
        """Every job held: (namespace, name)."""
        return self.stores[JOBS.plural].keys()

    def pods(self, namespace: str, job: str) -> tuple[PodView, ...]:
        """Every pod of the job (node, store and etcd pods alike), by name."""
        return self.stores[PODS.plural].of_job(namespace, job)

    def get(self, kind: Watched, namespace: str, name: str) -> Any:
        """What is kept of one object (Watched.keep); None when it does not exist (or may not be listed)."""
        return self.stores[kind.plural].get(namespace, name)

    def exists(self, kind: Watched, namespace: str, name: str) -> bool | None:
        """Whether the object exists; None when the operator may not list that kind there (403)."""
        if self._is_forbidden(kind.plural, namespace):
            return None
        return self.stores[kind.plural].get(namespace, name) is not None

    def offer(self, body: Mapping[str, Any]) -> None:
        """A copy of an object from outside the watch (kopf's handler body, the answer to our own
        PATCH or create): kept when newer than the cached one. A create's answer kept at once
        spares the next pass, when it comes before the watch's event, from planning the object
        again: a second create, refused (409) and read back, two requests for nothing per object
        (a busy operator's passes came within 0.2 s of its creates, and half the pods were unseen)."""
        store = self.stores.get(BY_KIND[body.get("kind") or C.KIND].plural)
        if store is not None:
            store.put(body)

    async def synced(self) -> None:
        """Returns once every watch has listed once."""
        for event in self._synced.values():
            await event.wait()

    def refusal(self, kind: Watched, namespace: str) -> Exception | None:
        """The API's refusal (403) to list ``kind`` in ``namespace``; None when it may be listed."""
        return self._forbidden.get((kind.plural, namespace)) or self._forbidden.get((kind.plural, None))

    def _is_forbidden(self, plural: str, namespace: str) -> bool:
        return (plural, namespace) in self._forbidden or (plural, None) in self._forbidden

    # ------------------------------------------------------------------ the watches

    def start(self) -> None:
        for kind in self.stores.values():
            for namespace in self.namespaces:
                self._tasks.append(asyncio.get_running_loop().create_task(self._follow(kind.kind, namespace)))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    async def _follow(self, kind: Watched, namespace: str | None) -> None:
        """List, then watch from the list's resourceVersion; list again on 410 or after an error."""
        while True:
            try:
                version = await self._list(kind, namespace)
                while True:
                    version = await self._watch(kind, namespace, version)
            except Expired as e:
                logger.info("Watch of %s in %s expired (%s): listing again", kind.plural, namespace or "all", e)
            except asyncio.CancelledError:
                raise
            except (kube.ApiError, kube.RetryableError) as e:
                if getattr(e, "status", None) == 403:
                    self._forbid(kind, namespace, e)
                else:
                    logger.warning("Watching %s in %s failed (%s): listing again in %.0f s",
                                   kind.plural, namespace or "all", e, RETRY_SECONDS)
                await asyncio.sleep(RETRY_SECONDS)
            except Exception:  # a watch that died here would leave its kind frozen for good
                logger.exception("Watching %s in %s failed: listing again in %.0f s",
                                 kind.plural, namespace or "all", RETRY_SECONDS)
                await asyncio.sleep(RETRY_SECONDS)

    async def _list(self, kind: Watched, namespace: str | None) -> str:
        items, version = await self.api.list_objects(kind.api_version, kind.plural, namespace, kind.selector)
        touched = self.stores[kind.plural].replace(namespace, items)
        self._forbidden.pop((kind.plural, namespace), None)
        self._synced[(kind.plural, namespace)].set()
        if kind.job_of is not None:
            for job in touched:
                self.poke(job)
        return version

    async def _watch(self, kind: Watched, namespace: str | None, version: str) -> str:
        """One watch request until the server ends it; returns the last resourceVersion seen."""
        store = self.stores[kind.plural]
        async for event in self.api.watch(kind.api_version, kind.plural, namespace, kind.selector, version,
                                          WATCH_SECONDS):
            kind_of_event, obj = event.get("type"), event.get("object") or {}
            if kind_of_event == "ERROR":
                if obj.get("code") == 410:
                    raise Expired(obj.get("message", "410 Gone"))
                raise kube.RetryableError(f"watch {kind.plural}", obj.get("code"), obj.get("reason", ""),
                                          obj.get("message", ""))
            version = (obj.get("metadata") or {}).get("resourceVersion") or version
            if kind_of_event == "BOOKMARK":
                continue
            if kind_of_event == "DELETED":
                store.remove(obj)
            else:
                store.put(obj)
            job = kind.job_of(obj) if kind.job_of is not None else None
            if job and kind_of_event in kind.pokes_on:
                self.poke(((obj.get("metadata") or {}).get("namespace") or "", job))
        return version

    def _forbid(self, kind: Watched, namespace: str | None, error: Exception) -> None:
        """The operator may not list this kind here: passes read it as unknown (None), and the
        list is tried again every RETRY_SECONDS in case someone grants it."""
        if (kind.plural, namespace) not in self._forbidden:  # the pass that reads them says what it means
            logger.info("Cannot list %s in %s (%s): trying again every %.0f s",
                        kind.plural, namespace or "any namespace", error, RETRY_SECONDS)
        self._forbidden[(kind.plural, namespace)] = error
        self._synced[(kind.plural, namespace)].set()
