"""The only module that calls the Kubernetes API.

Writes are idempotent so that a pass can be repeated after a crash or a conflict without harm:
creating an object that already exists is skipped (409) when the one found has the same
controller (anyone else's is a ForeignObjectError), deleting one that is gone is skipped (404), and a delete names the uid it means so it never removes a newer pod of the same name.
Errors that a retry may fix (HTTP 429 and 5xx, lost connections) become ``RetryableError``, a
``kopf.TemporaryError``, so kopf retries the handler after a delay instead of the handler
sleeping; the others become ``ApiError``. Both keep the API's status, reason, message and
Retry-After, so the caller can report a refused create and back off (apply, backoff).

The connection comes from kopf's own login functions (in-cluster service account, else the
kubeconfig), so the operator and kopf always talk to the same server with the same identity.
"""
from __future__ import annotations

import asyncio
import datetime
import json
import socket
import ssl
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import kopf

from ddpjob_operator.api.constants import (
    API_VERSION, GROUP, MANAGED_BY, MAX_EVENT_MESSAGE_CHARS, NETWORKING_API_VERSION, PLURAL, POLICY_API_VERSION,
    VERSION
)
from ddpjob_operator.decide.observed import controller_of

RETRY_DELAY_SECONDS = 2.0  # how long kopf waits before retrying a handler after a transient API error
REQUEST_TIMEOUT_SECONDS = 30.0  # one API call; a hung server must not hang a reconcile forever
# The client's rate, as client-go's --kube-api-qps/--kube-api-burst: the defaults of Kubeflow's
# training-operator and kube-controller-manager. A burst of 30 covers one job's pods, Service,
# status and Event at once; 1,000 jobs created together are spread out instead of opening
# 1,000 connections. Watches are not counted: each is one long request.
DEFAULT_QPS = 20.0
DEFAULT_BURST = 30
# Reconcile passes running at once (--max-concurrent-passes; passes.JobPasses). A pass mostly
# waits on the API, so a few overlap well; more only queue at the rate limit and hold memory.
DEFAULT_CONCURRENT_PASSES = 16
FOREIGN_OBJECT_REASON = "ForeignObject"  # the reason of a ForeignObjectError (and of the condition it causes)
WATCH_LINE_BYTES = 3 * 2**20  # one watch event is one line: room for an object near etcd's 1.5 MiB cap

# Kinds the operator writes; all core/v1 except those in _API_VERSIONS.
_PLURALS = {"Pod": "pods", "Service": "services", "Event": "events", "NetworkPolicy": "networkpolicies",
            "PodDisruptionBudget": "poddisruptionbudgets"}
_API_VERSIONS = {"NetworkPolicy": NETWORKING_API_VERSION, "PodDisruptionBudget": POLICY_API_VERSION}


class ApiError(Exception):
    """The API answered with an error status that a retry will not fix."""

    def __init__(self, status: int, reason: str, message: str, what: str, retry_after: float | None = None):
        self.status = status
        self.reason = reason
        self.api_message = message  # the API's own words, e.g. "exceeded quota: ..."
        self.retry_after = retry_after
        super().__init__(f"{what}: HTTP {status} {reason}: {message}")


class ForeignObjectError(ApiError):
    """The operator's create met an object of the same name that its owner does not control
    (HTTP 409): it is left alone, and the job's creates report it and back off."""

    def __init__(self, kind: str, name: str, wanted: Mapping[str, Any], found: Mapping[str, Any] | None, what: str):
        holder = (f"is controlled by {found.get('kind')} {found.get('name')!r} (uid {found.get('uid')})"
                  if found is not None else "has no controller")
        message = (f"{kind} {name!r} already exists and {holder}, not by {wanted.get('kind')} "
                   f"{wanted.get('name')!r} (uid {wanted.get('uid')}): the operator neither adopts nor "
                   f"replaces it; delete or rename it so the job can create its own")
        super().__init__(409, FOREIGN_OBJECT_REASON, message, what)


class RetryableError(kopf.TemporaryError):
    """An error a retry may fix: HTTP 429 or 5xx (``status``), or no answer at all (``status`` None)."""

    def __init__(self, what: str, status: int | None = None, reason: str = "", message: str = "",
                 retry_after: float | None = None):
        self.status = status
        self.reason = reason
        self.api_message = message
        self.retry_after = retry_after  # seconds the server asked us to wait (429, 503), when it said
        text = f"{what}: HTTP {status} {reason}: {message}" if status is not None else f"{what}: {message}"
        super().__init__(text, delay=RETRY_DELAY_SECONDS)


def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """kopf's service-account login inside a cluster, else its kubeconfig login.

    Raises:
        kopf.PermanentError: the kubeconfig named by KUBECONFIG cannot be read (retrying will not help).
    """
    try:
        return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)
    except OSError as e:
        raise kopf.PermanentError(
            f"cannot read the kubeconfig ({e}): set KUBECONFIG to a readable kubeconfig file, "
            f"or run the operator in a pod with a service account") from e


def object_path(api_version: str, plural: str, namespace: str | None, name: str | None = None,
                subresource: str | None = None) -> str:
    """The REST path of a collection or an object: /api/v1/... for the core group, /apis/... otherwise."""
    parts = ["/api/v1" if api_version == "v1" else f"/apis/{api_version}"]
    if namespace is not None:
        parts += ["namespaces", namespace]
    parts.append(plural)
    if name is not None:
        parts.append(name)
    if subresource is not None:
        parts.append(subresource)
    return "/".join(parts)


def job_path(namespace: str, name: str | None = None, subresource: str | None = None) -> str:
    return object_path(API_VERSION, PLURAL, namespace, name, subresource)


class RateLimit:
    """A token bucket: ``burst`` requests at once, then ``qps`` a second (qps 0: no limit).

    Tokens are reserved in arrival order (the count may go below zero), so waiters are
    served first come, first served, each sleeping only as long as its own turn needs.
    """

    def __init__(self, qps: float = DEFAULT_QPS, burst: int = DEFAULT_BURST):
        self.qps, self.burst = qps, max(1, burst)
        self._tokens, self._at = float(self.burst), time.monotonic()

    async def wait(self) -> None:
        if self.qps <= 0:
            return
        now = time.monotonic()
        self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.qps) - 1
        self._at = now
        if self._tokens < 0:
            await asyncio.sleep(-self._tokens / self.qps)


class Kube:
    """An aiohttp session to the API server with the operator's few verbs."""

    def __init__(self, info: kopf.ConnectionInfo, rate: RateLimit | None = None):
        self._info = info
        self.rate = rate or RateLimit()
        self._session: aiohttp.ClientSession | None = None
        self._watch_session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        for session in (self._session, self._watch_session):
            if session is not None:
                await session.close()
        self._session = self._watch_session = None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = self._new_session(aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_SECONDS), limit=64)
        return self._session

    def _open_watches(self) -> aiohttp.ClientSession:
        """Watches stay open for minutes and would hold the request pool's connections: their own pool."""
        if self._watch_session is None or self._watch_session.closed:
            self._watch_session = self._new_session(
                aiohttp.ClientTimeout(total=None, sock_connect=REQUEST_TIMEOUT_SECONDS), limit=0,
                read_bufsize=WATCH_LINE_BYTES)
        return self._watch_session

    def _new_session(self, timeout: aiohttp.ClientTimeout, limit: int,
                     read_bufsize: int = 2**16) -> aiohttp.ClientSession:
        info = self._info
        headers = {"User-Agent": f"{MANAGED_BY}/{GROUP}"}
        auth = None
        if info.token:
            headers["Authorization"] = f"{info.scheme or 'Bearer'} {info.token}"
        elif info.username:
            auth = aiohttp.BasicAuth(info.username, info.password or "")
        return aiohttp.ClientSession(
            base_url=info.server.rstrip("/") + "/", headers=headers, auth=auth, timeout=timeout,
            connector=aiohttp.TCPConnector(ssl=_ssl_context(info), limit=limit), read_bufsize=read_bufsize)

    async def request(self, method: str, path: str, body: Any = None, *,
                      content_type: str = "application/json", params: Mapping[str, str] | None = None) -> Any:
        """One API call; returns the decoded JSON. Raises ApiError, or RetryableError where a retry may help."""
        what = f"{method} {path}"
        await self.rate.wait()
        try:
            async with self._open().request(method, path.lstrip("/"), json=body, params=params,
                                            headers={"Content-Type": content_type}) as response:
                text = await response.text()
                status = response.status
                retry_after = response.headers.get("Retry-After")
        except (aiohttp.ClientError, TimeoutError) as e:
            raise RetryableError(what, message=repr(e)) from e
        payload = _decode(text)
        if status < 400:
            return payload
        reason = payload.get("reason", "") if isinstance(payload, dict) else ""
        message = payload.get("message", "") if isinstance(payload, dict) else str(payload)
        wait = _retry_after(retry_after, payload)
        if status == 429 or status >= 500:
            raise RetryableError(what, status, reason, message, wait)
        raise ApiError(status, reason, message, what, wait)

    # ------------------------------------------------------------------ verbs

    async def create_or_skip(self, obj: Mapping[str, Any], namespace: str) -> dict | None:
        """Creates ``obj`` and returns it as the API server stored it; None (not an error) when it
        exists already and is ours, e.g. from a pass before a restart.

        A 409 alone does not say whose the object is: anyone who may create pods can take a
        name the operator will use. So an ``obj`` with a controller ownerReference is read
        back, and counts as existing only when the one found has the same controller uid.

        Raises:
            ForeignObjectError: an object of that name exists with another controller, or none.
        """
        path = object_path(obj["apiVersion"], _PLURALS[obj["kind"]], namespace)
        try:
            return await self.request("POST", path, obj)
        except ApiError as e:
            if e.status != 409:
                raise
            await self._check_controller(obj, namespace)
            return None

    async def _check_controller(self, obj: Mapping[str, Any], namespace: str) -> None:
        """Raises ForeignObjectError when the object named like ``obj`` has not ``obj``'s controller."""
        meta = obj.get("metadata") or {}
        wanted = controller_of(meta)
        if wanted is None:  # nothing to compare with (an object the operator does not own)
            return
        found = await self.find_by_name(obj["apiVersion"], _PLURALS[obj["kind"]], namespace, meta["name"])
        if found is None:  # deleted since the 409: the next pass creates it
            return
        theirs = controller_of(found.get("metadata") or {})
        if theirs is None or theirs.get("uid") != wanted.get("uid"):
            path = object_path(obj["apiVersion"], _PLURALS[obj["kind"]], namespace, meta["name"])
            raise ForeignObjectError(obj["kind"], meta["name"], wanted, theirs, f"POST {path}")

    async def delete_or_skip(self, kind: str, namespace: str, name: str, uid: str | None = None,
                             grace_period_seconds: int | None = None) -> bool:
        """Deletes one object, only the incarnation with ``uid`` when given; False when it is gone already.

        ``grace_period_seconds=0`` force-deletes a pod: the API server removes it without waiting
        for its kubelet to confirm (for a pod whose node is down and never will).
        """
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
        if grace_period_seconds is not None:
            body["gracePeriodSeconds"] = grace_period_seconds
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            await self.request("DELETE", object_path(_API_VERSIONS.get(kind, "v1"), _PLURALS[kind], namespace, name),
                                body)
        except ApiError as e:
            if e.status in (404, 409):  # gone, or replaced by a newer object of the same name
                return False
            raise
        return True

    async def _get_or_none(self, path: str) -> dict | None:
        """GET `path`; None when the object does not exist (404), any other error raised."""
        try:
            return await self.request("GET", path)
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    async def get_or_none(self, kind: str, namespace: str, name: str) -> dict | None:
        """One object of a kind the operator writes; None when it does not exist. (Passes read these
        from the cache, controller/cache.py; this is for a one-off look.)"""
        return await self._get_or_none(object_path(_API_VERSIONS.get(kind, "v1"), _PLURALS[kind], namespace, name))

    async def patch_or_skip(self, kind: str, namespace: str, name: str, patch: Mapping[str, Any]) -> bool:
        """One merge-patch of an object; False (not an error) when it is gone (404)."""
        try:
            await self.request("PATCH", object_path(_API_VERSIONS.get(kind, "v1"), _PLURALS[kind], namespace, name),
                               dict(patch), content_type="application/merge-patch+json")
        except ApiError as e:
            if e.status == 404:
                return False
            raise
        return True

    async def get_secret(self, namespace: str, name: str) -> dict | None:
        """A Secret (its ``data`` base64-encoded, as the API returns it); None when it does not exist."""
        return await self._get_or_none(object_path("v1", "secrets", namespace, name))

    async def get_node(self, name: str) -> dict | None:
        """A Node (cluster-scoped); None when it does not exist. Raises ApiError 403 without the grant."""
        return await self._get_or_none(object_path("v1", "nodes", None, name))

    async def list_objects(self, api_version: str, plural: str, namespace: str | None,
                           label_selector: str = "", field_selector: str = "") -> tuple[list[dict], str]:
        """Every object of a kind (in ``namespace``; None: all) and the list's resourceVersion,
        where a watch of the same kind starts."""
        params = {k: v for k, v in (("labelSelector", label_selector), ("fieldSelector", field_selector)) if v}
        params = params or None
        result = await self.request("GET", object_path(api_version, plural, namespace), params=params)
        return list(result.get("items") or []), str((result.get("metadata") or {}).get("resourceVersion") or "")

    async def find_by_name(self, api_version: str, plural: str, namespace: str | None, name: str) -> dict | None:
        """One object, None when it does not exist. A LIST by name, not a GET: the operator lists
        (and watches) every kind it reads, and needs no `get` grant for these rare reads."""
        found, _ = await self.list_objects(api_version, plural, namespace, field_selector=f"metadata.name={name}")
        return found[0] if found else None

    async def watch(self, api_version: str, plural: str, namespace: str | None, label_selector: str,
                    resource_version: str, seconds: int, field_selector: str = "") -> AsyncIterator[dict]:
        """The watch events after ``resource_version``, one dict each, until the server ends the
        watch (after ``seconds``). An ERROR event (410 Gone, ...) is yielded like the others.

        Raises:
            ApiError, RetryableError: the watch request itself was refused or the connection broke.
        """
        params = {"watch": "true", "resourceVersion": resource_version, "timeoutSeconds": str(seconds),
                  "allowWatchBookmarks": "true"}
        if label_selector:
            params["labelSelector"] = label_selector
        if field_selector:
            params["fieldSelector"] = field_selector
        path = object_path(api_version, plural, namespace)
        await self.rate.wait()
        try:
            async with self._open_watches().get(path.lstrip("/"), params=params) as response:
                if response.status >= 400:
                    payload = _decode(await response.text())
                    reason = payload.get("reason", "") if isinstance(payload, dict) else ""
                    message = payload.get("message", "") if isinstance(payload, dict) else str(payload)
                    if response.status == 429 or response.status >= 500:
                        raise RetryableError(f"WATCH {path}", response.status, reason, message)
                    raise ApiError(response.status, reason, message, f"WATCH {path}")
                async for line in response.content:
                    if line.strip():
                        yield json.loads(line)
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            raise RetryableError(f"WATCH {path}", message=repr(e)) from e

    async def patch_job_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> dict | None:
        """One merge-patch of the status subresource; None when the job was deleted meanwhile."""
        try:
            return await self.request("PATCH", job_path(namespace, name, "status"), {"status": dict(status)},
                                      content_type="application/merge-patch+json")
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    async def delete_job(self, namespace: str, name: str, uid: str) -> bool:
        try:
            await self.request("DELETE", job_path(namespace, name),
                               {"propagationPolicy": "Background", "preconditions": {"uid": uid}})
        except ApiError as e:
            if e.status in (404, 409):
                return False
            raise
        return True

    async def post_event(self, job: Mapping[str, Any], event_type: str, reason: str, message: str) -> None:
        """A core/v1 Event about the job, as ``kubectl describe ddpjob`` shows them."""
        meta = job["metadata"]
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": f"{GROUP}/{VERSION}", "kind": job.get("kind", "DDPJob"),
                               "name": meta["name"], "namespace": meta["namespace"], "uid": meta.get("uid"),
                               "resourceVersion": meta.get("resourceVersion")},
            "type": event_type, "reason": reason, "message": message[:MAX_EVENT_MESSAGE_CHARS],  # the API caps messages
            "source": {"component": MANAGED_BY}, "reportingComponent": MANAGED_BY,
            "reportingInstance": socket.gethostname(), "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        await self.request("POST", object_path("v1", "events", meta["namespace"]), event)


def _decode(text: str) -> Any:
    try:
        return json.loads(text) if text else None
    except ValueError:  # not JSON: a proxy's or a crashed server's error page
        return text


def _retry_after(header: str | None, payload: Any) -> float | None:
    """Seconds to wait from a Retry-After header (the delta-seconds form the API server sends)
    or the Status' details.retryAfterSeconds; None when neither says."""
    if header and header.strip().isdigit():
        return float(header.strip())
    details = payload.get("details") if isinstance(payload, dict) else None
    seconds = details.get("retryAfterSeconds") if isinstance(details, dict) else None
    return float(seconds) if isinstance(seconds, int) and seconds > 0 else None


def _ssl_context(info: kopf.ConnectionInfo) -> ssl.SSLContext | bool:
    if not info.server.startswith("https"):
        return False
    if info.insecure:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        ca_data = info.ca_data.decode() if isinstance(info.ca_data, bytes) else info.ca_data
        context = ssl.create_default_context(cafile=info.ca_path, cadata=ca_data)
    if info.certificate_path and info.private_key_path:
        context.load_cert_chain(info.certificate_path, info.private_key_path)
    return context
