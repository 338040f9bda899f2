"""Deletes a job's etcd rendezvous keys when it finishes and when it is deleted; best effort, bounded.

Only ``etcd-v3`` jobs are cleaned: their keys live under ``/ddpjob/rdzv/<namespace>/<uid>/``
(and ``<uid>-<n>/`` for later rendezvous generations; ``ddpjob_rdzv.keys``, the one definition
the trainer's backend uses too), and exactly those prefixes are deleted.
torch's ``etcd`` backend writes etcd's v2 store, which the v3 client cannot
reach, and puts TTLs on its keys itself; c10d keeps nothing outside the pods.

When, and why it is safe to give up:

* **On finish**: after a pass that left the job Succeeded or Failed with no node
  pod still active (deleting the keys under a live agent would restart its
  rendezvous). One attempt per job per operator process; a failure is a
  Warning Event, and the deletion tries again.
* **On delete**: a kopf finalizer, added only to etcd-v3 jobs, runs
  :meth:`RendezvousCleaner.on_delete`. It makes at most ``DELETE_ATTEMPTS``
  attempts of at most ``timeout`` seconds each, then releases the finalizer even
  when every attempt failed, so an unreachable etcd delays a deletion by about
  ``DELETE_ATTEMPTS * (timeout + RETRY_DELAY_SECONDS)`` seconds, never forever.

* **Without the right to read the Secret** (``rdzvSecretName``, chart value
  ``rbac.readSecrets`` off, the default): the API answers 403, retrying cannot
  help, so the cleanup is skipped at once with one Warning Event naming the
  chart value, on finish and on delete alike (the finalizer is released without
  further attempts).

Giving up leaks nothing for long: every key carries the writing agent's lease
(``lease_ttl``, 2 h by default) and disappears when it expires.

The etcd client is blocking (gRPC), so each attempt runs in a worker thread,
with the client's own ``read_timeout`` as the bound.

The endpoints are the user's (spec.elasticPolicy.rdzvEndpoints): one may never answer. So a
cleanup never runs inside a reconcile pass (a pass only starts it, and its concurrency slot
is free at once), at most ``CONCURRENT_CLEANUPS`` dial at a time, each in this module's own
threads (a dial that hangs past its bound keeps a thread of ours, never one of the event
loop's default pool), and each is abandoned after ``timeout + GRACE_SECONDS``.
"""
from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import logging
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kopf

from ddpjob_operator.api import constants as C
from ddpjob_operator.controller import kube
from ddpjob_operator.render.launch import rdzv_id
from ddpjob_operator.decide.observed import PodView
from ddpjob_operator.api.job_ref import JobRef
from ddpjob_operator.api.spec import DDPJobSpec
from ddpjob_operator.api.validation import validate_job
from ddpjob_rdzv import BACKEND_NAME, keys
from ddpjob_rdzv.settings import CREDENTIAL_FILES

logger = logging.getLogger("ddpjob_operator")

TIMEOUT_ENV = "DDPJOB_RDZV_CLEANUP_TIMEOUT_SECONDS"  # overrides DEFAULT_TIMEOUT_SECONDS (tests, slow etcd)
DEFAULT_TIMEOUT_SECONDS = 10  # one attempt: how long the client keeps failing over between endpoints
DELETE_ATTEMPTS = 3  # attempts before a deletion gives up and releases the finalizer
RETRY_DELAY_SECONDS = 2.0  # pause between attempts on deletion
# Cleanups dialling etcd at once (and the threads they run in): a few finished jobs clean up
# together; a burst of 1,000 waits its turn instead of opening 1,000 connections and threads.
CONCURRENT_CLEANUPS = 4
GRACE_SECONDS = 5.0  # past the client's own timeout, an attempt is abandoned

REASON_CLEANED = "RendezvousKeysDeleted"  # Normal: the job's etcd keys were deleted
REASON_CLEANUP_FAILED = "RendezvousCleanupFailed"  # Warning: they could not be (etcd down, bad credentials)
# The chart value that grants reading rdzvSecretName (charts/ddpjob-operator/values.yaml).
READ_SECRETS_VALUE = "rbac.readSecrets"


@dataclass(frozen=True)
class CleanupTarget:
    """Where a job's rendezvous keys are and how to authenticate."""

    endpoints: tuple[str, ...]
    run_id: str  # metadata.uid, the job's first --rdzv_id
    secret_name: str | None  # spec.elasticPolicy.rdzvSecretName
    generations: int = 0  # status.rendezvousGeneration: later groups ran as <uid>-<generation>
    namespace: str = "default"  # metadata.namespace: the agents' keys live under it (DDPJOB_NAMESPACE)
    allow_insecure_credentials: bool = False  # spec.elasticPolicy.rdzvAllowInsecureCredentials

    @property
    def run_ids(self) -> list[str]:
        """Every --rdzv_id the job's groups used (launch.rdzv_id)."""
        return [rdzv_id(self.run_id, generation) for generation in range(self.generations + 1)]

    @property
    def prefix(self) -> str:
        """Where the keys are, for messages (the first group's prefix, plus later ones when any)."""
        first = keys.run_prefix(self.namespace, self.run_id)
        return first if not self.generations else f"{first} (and {self.generations} later generation(s))"


def cleanup_target(body: Mapping[str, Any]) -> CleanupTarget | None:
    """The keys of an etcd-v3 job; None for other backends, an invalid spec or a job without a uid."""
    uid = (body.get("metadata") or {}).get("uid")
    if not uid or validate_job(body):
        return None
    ep = DDPJobSpec.model_validate(body.get("spec") or {}).elastic_policy
    if ep.rdzv_backend != BACKEND_NAME or ep.managed_etcd.enabled:  # a managed etcd goes with the job, keys and all
        return None
    generations = int((body.get("status") or {}).get("rendezvousGeneration") or 0)
    return CleanupTarget(tuple(ep.rdzv_endpoints), uid, ep.rdzv_secret_name, generations,
                         JobRef.from_body(body).namespace, ep.rdzv_allow_insecure_credentials)


def needs_finalizer(body: Mapping[str, Any], **_: Any) -> bool:
    """kopf ``when=`` filter: only etcd-v3 jobs get the deletion finalizer (a plain c10d job is never held up)."""
    return cleanup_target(body) is not None


def due_on_finish(status: Mapping[str, Any], pods: Iterable[PodView]) -> bool:
    """Finished, and no node pod still runs an agent that would miss its rendezvous state."""
    return status.get("phase") in C.FINISHED_PHASES and not any(p.active for p in pods)


def timeout_seconds() -> float:
    return float(os.environ.get(TIMEOUT_ENV) or DEFAULT_TIMEOUT_SECONDS)


class CleanupError(Exception):
    """The keys could not be deleted; the message says where, why, and what happens to them."""


class CleanupForbidden(CleanupError):
    """The operator may not read the job's Secret: no retry helps until someone grants it."""


def write_credentials(secret: Mapping[str, Any], directory: Path) -> None:
    """The Secret's documented keys as files, the layout the pods see at the Secret's mount."""
    data = secret.get("data") or {}
    for name in CREDENTIAL_FILES:
        if data.get(name):
            path = directory / name
            path.write_bytes(base64.b64decode(data[name]))
            path.chmod(0o600)


def delete_keys(target: CleanupTarget, credentials_dir: str | None, timeout: float) -> int:
    """Blocking: deletes the run's keys (see ddpjob_rdzv.cleanup); returns how many were deleted."""
    from ddpjob_rdzv.cleanup import delete_rendezvous  # imports etcd3 and protobuf on first use only

    options: dict[str, Any] = {"read_timeout": max(1, int(timeout))}
    if credentials_dir:
        options["credentials_dir"] = credentials_dir
    if target.allow_insecure_credentials:  # the same permission the job's agents got (launch.credential_conf)
        options["allow_insecure_credentials"] = "true"
    return sum(delete_rendezvous(list(target.endpoints), run_id, namespace=target.namespace, **options)
               for run_id in target.run_ids)


class RendezvousCleaner:
    """Runs the cleanups of one operator process and remembers the jobs already cleaned."""

    def __init__(self, api: kube.Kube, concurrency: int = CONCURRENT_CLEANUPS):
        self._api = api
        self._slots = asyncio.Semaphore(concurrency)
        self._threads = concurrent.futures.ThreadPoolExecutor(concurrency, thread_name_prefix="ddpjob-rdzv-cleanup")
        self._tasks: set[asyncio.Task] = set()  # cleanups started after passes, still running
        self._tried_on_finish: set[str] = set()  # uids whose finish cleanup ran (once per process)
        self._cleaned: set[str] = set()  # uids whose keys this process deleted
        self._forbidden: set[str] = set()  # uids already told that their Secret may not be read

    def after_pass(self, job: Mapping[str, Any], pods: Iterable[PodView], status: Mapping[str, Any]) -> None:
        """Once per finished job: starts deleting its keys, in the background (the pass does not
        wait for the user's etcd); a failure is a Warning Event, and deletion tries again."""
        target = cleanup_target(job)
        if target is None or target.run_id in self._tried_on_finish or not due_on_finish(status, pods):
            return
        self._tried_on_finish.add(target.run_id)  # one attempt per process, even if it fails
        task = asyncio.get_running_loop().create_task(self._clean_on_finish(job, target))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def close(self) -> None:
        """At shutdown: drops the cleanups not started yet; a dial under way ends at its client's timeout."""
        self._threads.shutdown(wait=False, cancel_futures=True)

    async def idle(self) -> None:
        """Waits for the cleanups started after passes (tests; a clean shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def _clean_on_finish(self, job: Mapping[str, Any], target: CleanupTarget) -> None:
        try:
            await self._clean(job, target)
        except CleanupForbidden as e:
            await self._skip(job, target, e)
        except CleanupError as e:
            await self._event(job, C.EVENT_WARNING, REASON_CLEANUP_FAILED,
                              f"{e}; the operator tries again when the job is deleted")

    async def on_delete(self, job: Mapping[str, Any], retry: int) -> None:
        """The finalizer's work; raises TemporaryError to retry, returns (releasing it) after the last attempt."""
        target = cleanup_target(job)
        if target is None:
            return
        if target.run_id not in self._cleaned:  # already done when the job finished
            try:
                await self._clean(job, target)
            except CleanupForbidden as e:  # retrying cannot help: release the finalizer now
                await self._skip(job, target, e)
            except CleanupError as e:
                attempt = retry + 1
                if attempt < DELETE_ATTEMPTS:
                    logger.info("Rendezvous cleanup of %s failed (attempt %d of %d): %s",
                                job["metadata"]["name"], attempt, DELETE_ATTEMPTS, e)
                    raise kopf.TemporaryError(str(e), delay=RETRY_DELAY_SECONDS) from e
                await self._event(job, C.EVENT_WARNING, REASON_CLEANUP_FAILED,
                                  f"{e}; gave up after {DELETE_ATTEMPTS} attempts so that the deletion "
                                  f"completes; the keys expire with their lease (rdzv_conf lease_ttl)")
        self._forget(target.run_id)

    async def _skip(self, job: Mapping[str, Any], target: CleanupTarget, error: CleanupForbidden) -> None:
        """One Warning per job and process: the cleanup needs a grant the operator lacks."""
        if target.run_id in self._forbidden:
            logger.info("%s", error)
            return
        self._forbidden.add(target.run_id)
        await self._event(job, C.EVENT_WARNING, REASON_CLEANUP_FAILED, str(error))

    async def _clean(self, job: Mapping[str, Any], target: CleanupTarget) -> None:
        timeout = timeout_seconds()
        with tempfile.TemporaryDirectory(prefix="ddpjob-rdzv-") as directory:  # mode 0700
            credentials = await self._credentials(job, target, Path(directory))
            async with self._slots:
                dial = asyncio.get_running_loop().run_in_executor(
                    self._threads, delete_keys, target, credentials, timeout)
                try:
                    deleted = await asyncio.wait_for(dial, timeout + GRACE_SECONDS)
                except TimeoutError as e:
                    raise CleanupError(self._failure(target, f"no answer within {timeout + GRACE_SECONDS:g}s "
                                                             f"({TIMEOUT_ENV}={timeout:g}s + {GRACE_SECONDS:g}s)")) from e
                except Exception as e:  # noqa: BLE001 - any failure (unreachable, refused, bad settings) is reported
                    raise CleanupError(self._failure(target, e)) from e
        self._cleaned.add(target.run_id)
        await self._event(job, C.EVENT_NORMAL, REASON_CLEANED,
                          f"deleted {deleted} etcd key(s) of the rendezvous under {target.prefix} "
                          f"at {','.join(target.endpoints)}")

    async def _credentials(self, job: Mapping[str, Any], target: CleanupTarget, directory: Path) -> str | None:
        if not target.secret_name:
            return None
        namespace = job["metadata"]["namespace"]
        try:
            secret = await self._api.get_secret(namespace, target.secret_name)
        except (kube.ApiError, kopf.TemporaryError) as e:
            if isinstance(e, kube.ApiError) and e.status == 403:  # RBAC: no grant to read Secrets
                logger.info("Reading Secret %s/%s was refused: %s", namespace, target.secret_name, e)
                raise CleanupForbidden(
                    f"skipped deleting the etcd rendezvous keys under {target.prefix}: the operator may not "
                    f"read Secret {namespace}/{target.secret_name} (spec.elasticPolicy.rdzvSecretName); "
                    f"set the chart value {READ_SECRETS_VALUE}=true to let it; meanwhile the keys expire "
                    f"with their lease (rdzv_conf lease_ttl)") from e
            raise CleanupError(f"could not read Secret {namespace}/{target.secret_name} "
                               f"(spec.elasticPolicy.rdzvSecretName) to delete the rendezvous keys "
                               f"under {target.prefix}: {e}") from e
        if secret is None:
            raise CleanupError(f"Secret {namespace}/{target.secret_name} (spec.elasticPolicy.rdzvSecretName) "
                               f"does not exist, so the rendezvous keys under {target.prefix} could not be "
                               f"deleted: create it with keys {', '.join(CREDENTIAL_FILES)} as needed")
        write_credentials(secret, directory)
        return str(directory)

    def _forget(self, uid: str) -> None:
        """The job is gone (or about to be): its bookkeeping may go too."""
        self._tried_on_finish.discard(uid)
        self._cleaned.discard(uid)
        self._forbidden.discard(uid)

    @staticmethod
    def _failure(target: CleanupTarget, error: BaseException | str) -> str:
        reason = str(error) or type(error).__name__
        return (f"could not delete the etcd rendezvous keys under {target.prefix} at "
                f"{','.join(target.endpoints)} (spec.elasticPolicy.rdzvEndpoints): {reason}")

    async def _event(self, job: Mapping[str, Any], event_type: str, reason: str, message: str) -> None:
        log = logger.warning if event_type == C.EVENT_WARNING else logger.info
        log("%s/%s: %s", job["metadata"].get("namespace"), job["metadata"]["name"], message)
        try:
            await self._api.post_event(job, event_type, reason, message)
        except (kube.ApiError, kopf.TemporaryError) as e:  # a lost Event must not fail a pass or a deletion
            logger.warning("Could not post the %s Event about %s: %s", reason, job["metadata"]["name"], e)
