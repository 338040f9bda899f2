"""The operator process's state, built once at start-up: the API client, the cache, the pass
scheduler, and everything kept from pass to pass (refused creates, the API's answers that no
watch shows, statuses computed but not yet written, the cleanups started). handlers.py keeps one in kopf's memo and hands every
event to it; nothing of it is module-global.
"""
from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import kopf

from ddpjob_operator.api import constants as C
from ddpjob_operator.controller import kube
from ddpjob_operator.controller.backoff import CreateRetries
from ddpjob_operator.controller.cache import ClusterCache
from ddpjob_operator.controller.etcd_cleanup import RendezvousCleaner
from ddpjob_operator.controller.memory import ApiMemory, StatusMemory
from ddpjob_operator.controller.passes import JobKey, JobPasses, PassOutcome
from ddpjob_operator.controller.peering import Peering, PeeringView, wait_until_present
from ddpjob_operator.decide import writes
from ddpjob_operator.render.network_policy import OperatorPeer


@dataclasses.dataclass(frozen=True)
class PassSettings:
    """The operator's flags (main.py) that a pass needs."""

    progress_poll: float = C.PROGRESS_POLL_SECONDS  # --progress-poll-seconds (0: never)
    operator: OperatorPeer = OperatorPeer()  # --operator-pod-selector/-namespace
    max_replicas: int | None = C.DEFAULT_MAX_REPLICAS  # --max-replicas (None: no cap)
    status_write_interval: float = writes.DEFAULT_INTERVAL_SECONDS  # --status-write-interval-seconds (0: every change)


@dataclasses.dataclass
class PassContext:
    """What every pass of this operator process shares: the API, the cache, and what is kept
    from pass to pass (refused creates, the API's answers no watch shows, started cleanups)."""

    api: kube.Kube
    cache: ClusterCache
    cleaner: RendezvousCleaner | None = None
    settings: PassSettings = PassSettings()
    creates: CreateRetries = dataclasses.field(default_factory=CreateRetries)
    memory: ApiMemory = dataclasses.field(default_factory=ApiMemory)
    statuses: StatusMemory = dataclasses.field(default_factory=StatusMemory)  # computed, not yet written


Pass = Callable[[PassContext, JobKey], Awaitable[PassOutcome]]  # job_pass.run_pass


@dataclasses.dataclass
class OperatorState:
    """One operator process: ``context`` is what its passes share, ``passes`` runs them; with
    --peering, ``peering`` says whether this replica acts (its passes' pokes wait for it)."""

    context: PassContext
    passes: JobPasses
    peering: PeeringView | None = None
    _tasks: set[asyncio.Task] = dataclasses.field(default_factory=set)

    @classmethod
    def start(cls, info: kopf.ConnectionInfo, flags: Mapping[str, Any], run_pass: Pass) -> OperatorState:
        """Connects, and starts the cache's watches (whose events poke the jobs' passes).

        Args:
            info: the credentials kube.login found.
            flags: the operator's flags as main.py puts them in kopf's memo (defaults when absent).
            run_pass: one pass (job_pass.run_pass), handed in so that this module stays below it.
        """
        api = kube.Kube(info, kube.RateLimit(flags.get("kube_api_qps", kube.DEFAULT_QPS),
                                             flags.get("kube_api_burst", kube.DEFAULT_BURST)))
        settings = PassSettings(flags.get("progress_poll_seconds", C.PROGRESS_POLL_SECONDS),
                                flags.get("operator_peer", OperatorPeer()),
                                flags.get("max_replicas", C.DEFAULT_MAX_REPLICAS),
                                flags.get("status_write_interval_seconds", writes.DEFAULT_INTERVAL_SECONDS))
        passes = JobPasses(lambda key: run_pass(context, key),  # context is bound below, before any pass
                           limit=flags.get("max_concurrent_passes", kube.DEFAULT_CONCURRENT_PASSES))
        # Pod, Service and NetworkPolicy events reach the job's passes through the cache's watches.
        cache = ClusterCache(api, flags.get("watched_namespaces", ()), poke=passes.poke)
        context = PassContext(api, cache, RendezvousCleaner(api), settings)
        state = cls(context, passes)
        peering: Peering | None = flags.get("peering")
        if peering is not None:  # standby until follow_peering's view says otherwise
            state.peering = PeeringView(api, peering, on_active=state._pass_every_job)
            passes.acting = lambda: state.peering.active
        cache.start()
        return state

    async def follow_peering(self) -> None:
        """With --peering: waits for the peering object (peering.wait_until_present), then
        follows it; this replica's own passes run while kopf's rule says it acts.

        Raises:
            kopf.PermanentError: the object is still missing after the bound (the message names it).
        """
        if self.peering is None:
            return
        try:
            await wait_until_present(self.context.api, self.peering.peering)
        except LookupError as e:
            raise kopf.PermanentError(str(e)) from e
        self.peering.start()

    def _pass_every_job(self) -> None:
        """This replica takes over: a pass of every job, as at start-up. The timers and pokes of
        the replica that acted are gone with it, and kopf's resume handler, on resuming, runs
        only for the jobs this process has not handled before."""
        async def every_job() -> None:
            await self.context.cache.synced()
            for key in self.context.cache.job_keys():
                self.passes.poke(key)
        task = asyncio.get_running_loop().create_task(every_job())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def job_changed(self, body: Mapping[str, Any], key: tuple[str, str], retry: int) -> None:
        """A job appeared, changed its spec (replicas, suspend, ...) or was found at start-up.

        kopf's copy of the job goes into the cache (when newer), which the job's own watch may not
        have brought yet. A change may fix what a refused create complained of (resources, a
        quota-sized request): its creates are tried at once, not after their backoff (kopf's own
        retries do wait).

        Raises:
            kopf.PermanentError: the spec is invalid (the pass reported it in the status and an
                Event); retrying cannot fix it.
        """
        self.context.cache.offer(dict(body))
        if retry == 0:
            self.context.creates.retry_now(key)
        outcome = await self.passes.run_now(key)
        if outcome.invalid:
            raise kopf.PermanentError(f"invalid spec: {outcome.invalid}")

    async def job_deleted(self, body: Mapping[str, Any], retry: int) -> None:
        """An etcd-v3 job is being deleted: delete its rendezvous keys (bounded; see etcd_cleanup)."""
        if self.context.cleaner is not None:
            await self.context.cleaner.on_delete(body, retry)

    async def stop(self) -> None:
        if self.peering is not None:
            await self.peering.stop()
        await self.context.cache.stop()
        if self.context.cleaner is not None:
            self.context.cleaner.close()
        await self.context.api.close()
