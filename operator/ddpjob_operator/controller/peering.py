"""Whether this operator replica acts, by kopf's peering rule, for the work kopf does not gate.

kopf pauses its own watches and handlers while the peering object lists a live peer of a
higher (or the same) priority, and starts paused until the object's first event. The operator's
own cache watches and the passes they start (a pod's exit, a planned requeue, a progress poll)
are not kopf's: a standby replica ran them too, two replicas writing one job. ``PeeringView``
follows the same object with the same rule (``acts``); JobPasses drops its pokes while the view
says standby, and the view pokes every job when this replica takes over (kopf's resume handler
runs only for the jobs this process has not handled before). kopf's handlers need no gate: kopf
calls them only while it acts.

kopf's keep-alive patches the object and skips a missing one until its next try, ~50 s later,
and a replica that sees the object without peers acts: with the chart creating the object after
the Deployment, both replicas acted for ~50 s. ``wait_until_present`` (from the startup handler,
which kopf completes before its keep-alive starts) waits for the object, bounded, so the first
keep-alive lands.
"""
from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from ddpjob_operator.controller import kube

logger = logging.getLogger("ddpjob_operator")

API_VERSION = "kopf.dev/v1"
PRESENT_TIMEOUT_SECONDS = 120.0  # wait_until_present: then the operator exits, naming the object
PRESENT_POLL_SECONDS = 1.0
WATCH_SECONDS = 300
RETRY_SECONDS = 5.0  # after a failed list or watch of the peering object
DEFAULT_LIFETIME_SECONDS = 60  # kopf's, for a peer that does not say


@dataclasses.dataclass(frozen=True)
class Peering:
    """This replica in kopf's peering: the object (a ClusterKopfPeering when ``namespaces`` is
    empty, else a KopfPeering in each), and this replica's identity and priority, as kopf gets them
    (main.py hands both to kopf.run)."""

    name: str
    identity: str
    priority: int
    namespaces: tuple[str, ...] = ()

    @property
    def plural(self) -> str:
        return "kopfpeerings" if self.namespaces else "clusterkopfpeerings"

    @property
    def scopes(self) -> tuple[str | None, ...]:
        return self.namespaces or (None,)

    def describe(self, namespace: str | None) -> str:
        kind = "KopfPeering" if self.namespaces else "ClusterKopfPeering"
        return f"{kind} {self.name!r}" + (f" in namespace {namespace!r}" if namespace else "")


def acts(status: Mapping[str, Any], peering: Peering, now: datetime.datetime) -> tuple[bool, float | None]:
    """kopf's rule (kopf/_core/engines/peering.py, process_peering_event) on one peering object's
    status: this replica acts unless a live peer other than itself has a priority at least its
    own. Also returns the seconds until the first such peer expires (None: none blocks), when
    the answer may change without an event. An entry that is not kopf's is skipped."""
    blocking: list[float] = []
    for identity, peer in status.items():
        if identity == peering.identity or not isinstance(peer, Mapping):
            continue
        try:
            priority = int(peer.get("priority", 0))
            lifetime = float(peer.get("lifetime", DEFAULT_LIFETIME_SECONDS))
            seen = peer.get("lastseen")
            lastseen = datetime.datetime.fromisoformat(seen) if seen is not None else now
        except (TypeError, ValueError):
            continue
        if lastseen.tzinfo is None:
            lastseen = lastseen.replace(tzinfo=datetime.UTC)
        left = (lastseen - now).total_seconds() + lifetime
        if left > 0 and priority >= peering.priority:
            blocking.append(left)
    return not blocking, min(blocking, default=None)


async def wait_until_present(api: kube.Kube, peering: Peering, timeout: float = PRESENT_TIMEOUT_SECONDS,
                             poll: float = PRESENT_POLL_SECONDS) -> None:
    """Returns once the peering object exists in every scope.

    Raises:
        LookupError: one is still missing after ``timeout`` seconds (naming it, and what to do).
    """
    deadline, said = time.monotonic() + timeout, False
    missing = list(peering.scopes)
    while True:
        missing = [ns for ns in missing
                   if await api.find_by_name(API_VERSION, peering.plural, ns, peering.name) is None]
        if not missing:
            return
        if time.monotonic() >= deadline:
            raise LookupError(
                f"--peering {peering.name}: {peering.describe(missing[0])} does not exist after {timeout:.0f} s; "
                "kopf heartbeats only into an existing one. Create it (the chart does with peering.enabled) "
                "or run one replica without --peering")
        if not said:
            said = True
            logger.info("Waiting for %s (up to %.0f s): kopf heartbeats only into an existing one",
                        peering.describe(missing[0]), timeout)
        await asyncio.sleep(poll)


class PeeringView:
    """Follows the peering object in every scope and keeps ``active`` as kopf's rule says;
    ``on_active`` is called each time this replica goes from standby to acting."""

    def __init__(self, api: kube.Kube, peering: Peering, on_active: Callable[[], None] = lambda: None,
                 clock: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC)):
        self.api, self.peering, self.on_active, self._clock = api, peering, on_active, clock
        self._statuses: dict[str | None, Mapping[str, Any]] = {}  # scope -> status, once seen
        self._active = False
        self._recheck: asyncio.TimerHandle | None = None
        self._tasks: list[asyncio.Task] = []

    @property
    def active(self) -> bool:
        return self._active

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._follow(ns)) for ns in self.peering.scopes]

    async def stop(self) -> None:
        if self._recheck is not None:
            self._recheck.cancel()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def seen(self, namespace: str | None, obj: Mapping[str, Any]) -> None:
        """The object's current (or, deleted, last) copy in ``namespace``, as kopf reads its events."""
        status = obj.get("status")
        self._statuses[namespace] = status if isinstance(status, Mapping) else {}
        self.decide()

    def decide(self) -> None:
        """kopf's rule over every scope: standby until each object was seen (kopf starts paused),
        then acting only where each says so; looks again when the first blocking peer expires."""
        if self._recheck is not None:
            self._recheck.cancel()
            self._recheck = None
        now = self._clock()
        answers = [acts(self._statuses[ns], self.peering, now) for ns in self.peering.scopes if ns in self._statuses]
        active = len(answers) == len(self.peering.scopes) and all(ok for ok, _ in answers)
        expiries = [left for _, left in answers if left is not None]
        if expiries:
            self._recheck = asyncio.get_running_loop().call_later(min(expiries), self.decide)
        if active == self._active:
            return
        self._active = active
        if active:
            logger.info("Peering: this replica (%s) acts; every job gets a pass", self.peering.identity)
            self.on_active()
        else:
            logger.info("Peering: this replica (%s) stands by; its own passes stop", self.peering.identity)

    async def _follow(self, namespace: str | None) -> None:
        """List by name, then watch from the list's resourceVersion; again after an error."""
        selector = f"metadata.name={self.peering.name}"
        while True:
            try:
                found, version = await self.api.list_objects(API_VERSION, self.peering.plural, namespace,
                                                             field_selector=selector)
                if found:
                    self.seen(namespace, found[0])
                while True:
                    async for event in self.api.watch(API_VERSION, self.peering.plural, namespace, "", version,
                                                      WATCH_SECONDS, field_selector=selector):
                        obj = event.get("object") or {}
                        if event.get("type") == "ERROR":
                            raise kube.RetryableError(f"watch {self.peering.plural}", obj.get("code"),
                                                      obj.get("reason", ""), obj.get("message", ""))
                        version = (obj.get("metadata") or {}).get("resourceVersion") or version
                        if event.get("type") != "BOOKMARK":
                            self.seen(namespace, obj)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # kept acting or standing by as last seen, until the list works again
                logger.warning("Following %s failed (%s): listing again in %.0f s",
                               self.peering.describe(namespace), e, RETRY_SECONDS)
                await asyncio.sleep(RETRY_SECONDS)
