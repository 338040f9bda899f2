"""The emulator's state, CRD registration and request routing; writes and reads are its mixins."""
from __future__ import annotations

import asyncio
import collections
import copy
import json
import re
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import aiohttp.web
import attrs
import kmock
from kmock._internal import rendering

from ddpjob_sandbox.emulator.common import CRDS, NAMESPACES, Refusal, ScalePaths, api_error
from ddpjob_sandbox.emulator.reads import Reads
from ddpjob_sandbox.emulator.writes import Writes

# How many events per resource are kept for watches that resume from a resourceVersion;
# an older resourceVersion gets "410 Gone", as etcd compaction causes on a real server.
WATCH_LOG_SIZE = 20_000

# kmock's path parser fails on "/api/v1/namespaces" and reads "/api/v1/namespaces/NAME" as a
# namespace without a resource, so these paths are recognised before it runs.
_NAMESPACE_PATH = re.compile(r"^/api/v1/namespaces(?:/(?P<name>[^/]+)(?:/(?P<sub>status|finalize))?)?/?$")


@attrs.define(kw_only=True)
class KubeEmulator(Reads, Writes, kmock.KubernetesEmulator):
    """kmock's emulator with the API conventions listed in the module docstring."""

    _revision: int = attrs.field(default=0, init=False)
    _log: dict[Any, collections.deque] = attrs.field(
        factory=lambda: collections.defaultdict(lambda: collections.deque(maxlen=WATCH_LOG_SIZE)), init=False)
    _compacted: dict[Any, int] = attrs.field(factory=dict, init=False)  # expire_watches(): resume from here on
    _serving_loop: asyncio.AbstractEventLoop | None = attrs.field(default=None, init=False)  # for expire()
    _scales: dict[Any, ScalePaths] = attrs.field(factory=dict, init=False)
    _background: set[asyncio.Task] = attrs.field(factory=set, init=False)
    _pending: list[tuple[Any, dict]] = attrs.field(factory=list, init=False)
    # Seconds every write holds the server before it is applied (writes queue up, like a slow
    # etcd), so that tests can stop a client in the middle of a series of writes. Tests may
    # change it while serving.
    write_latency: float = 0.0
    # Pod grace periods, off unless a test turns them on: DELETE of a pod bound to a node
    # (spec.nodeName) only marks it (deletionTimestamp = now + grace period), as the API server
    # does while it waits for the kubelet; the pod goes on a second DELETE with
    # gracePeriodSeconds 0 (the kubelet's confirmation, or a force delete).
    graceful_pod_deletion: bool = False
    _write_queue: asyncio.Lock = attrs.field(factory=asyncio.Lock, init=False)  # reads do not wait on it
    # (HTTP method, resource plural) pairs answered 403 Forbidden, as for a client whose RBAC
    # lacks the grant, e.g. ("POST", "networkpolicies"); tests may change it while serving.
    forbidden: set[tuple[str, str]] = attrs.field(factory=set)
    # Authorization, off unless a test sets it: called with every resource request (discovery
    # is open to all, as on a real server); a message it returns is answered 403 Forbidden, the
    # way the API server answers a request its RBAC authorizer refuses (tests/support/rbac.py).
    authorize: Callable[[rendering.Request], str | None] | None = None
    # Creates per (plural, namespace), refused ones included; and the refusals tests asked for.
    create_attempts: collections.Counter = attrs.field(factory=collections.Counter, init=False)
    _refusals: dict[tuple[str, str | None], Refusal] = attrs.field(factory=dict, init=False)
    # Resource requests by (client, verb, plural): client is the User-Agent's product ("ddpjob-operator",
    # "kopf", "Python-urllib"), verb LIST/GET/WATCH/POST/PUT/PATCH/DELETE as the API server's audit
    # log names them. Read through request_counts(), from any thread (benchmarks read it while serving).
    _requests_by_verb: collections.Counter = attrs.field(factory=collections.Counter, init=False)
    _counts_lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        # Discovery for the built-in resources (pods, services, events, namespaces, CRDs...).
        self.resources.load_bundled()
        for name in ("default", "kube-system"):
            self._store_new(NAMESPACES, None, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        self._pending.clear()  # nobody watches yet

    # ----------------------------------------------------------------- refused creates

    def refuse_creates(self, plural: str, namespace: str | None, refusal: Refusal) -> None:
        """Answer every create of ``plural`` in ``namespace`` with ``refusal`` until ``allow_creates``."""
        self._refusals[(plural, namespace)] = refusal

    def allow_creates(self, plural: str, namespace: str | None) -> None:
        self._refusals.pop((plural, namespace), None)

    def _admit(self, request: rendering.Request) -> None:
        """Counts a create and refuses it when a test asked for that."""
        where = (request.resource.plural, request.namespace)
        self.create_attempts[where] += 1
        refusal = self._refusals.get(where)
        if refusal is not None:
            data = request.data if isinstance(request.data, dict) else {}
            name = (data.get("metadata") or {}).get("name", "")
            details = {"name": name, "kind": request.resource.plural}
            if refusal.retry_after is not None:
                details["retryAfterSeconds"] = refusal.retry_after
            raise api_error(refusal.status, refusal.reason, refusal.message.format(name=name), **details)

    async def __aenter__(self) -> "KubeEmulator":
        self._serving_loop = asyncio.get_running_loop()
        return await super().__aenter__()

    # ----------------------------------------------------------------- request counts

    def _count(self, request: rendering.Request) -> None:
        method = request.method.value.upper()
        if method == "GET":
            method = "WATCH" if request.action == kmock.action.WATCH else ("GET" if request.name else "LIST")
        agent = (request.headers.get("User-Agent") or "").split("/", 1)[0].split(" ", 1)[0] or "unknown"
        with self._counts_lock:
            self._requests_by_verb[(agent, method, request.resource.plural)] += 1

    def request_counts(self, agents: tuple[str, ...] | None = None, plural: str | None = None) -> collections.Counter:
        """Resource requests so far by verb, of the clients whose User-Agent product is in ``agents``
        (None: all) and of one resource (None: all)."""
        with self._counts_lock:
            counted = list(self._requests_by_verb.items())
        counts: collections.Counter = collections.Counter()
        for (agent, verb, res), n in counted:
            if (agents is None or agent in agents) and (plural is None or res == plural):
                counts[verb] += n
        return counts

    # ----------------------------------------------------------------- registration

    def register_crd(self, crd: Mapping[str, Any]) -> None:
        """Serves the custom resource a CRD manifest defines (discovery, subresources, scale paths)
        and stores the CRD itself, as ``kubectl apply -f crd.yaml`` would. Call before serving."""
        spec = crd["spec"]
        names = spec["names"]
        for version in spec["versions"]:
            if not version.get("served", True):
                continue
            res = kmock.resource(spec["group"], version["name"], names["plural"])
            subresources = version.get("subresources") or {}
            self.resources[res] = kmock.ResourceInfo(
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                kind=names["kind"],
                singular=names.get("singular", names["kind"].lower()),
                shortnames=names.get("shortNames", []),
                categories=names.get("categories", []),
                verbs={"create", "delete", "get", "list", "patch", "update", "watch"},
                subresources=set(subresources),
            )
            if "scale" in subresources:
                scale = subresources["scale"]
                self._scales[res] = ScalePaths(
                    scale["specReplicasPath"], scale["statusReplicasPath"], scale.get("labelSelectorPath"))
        body = copy.deepcopy(dict(crd))
        body.setdefault("apiVersion", "apiextensions.k8s.io/v1")
        body.setdefault("kind", "CustomResourceDefinition")
        if (CRDS, None, body["metadata"]["name"]) not in self.objects:
            self._store_new(CRDS, None, body)
        self._pending.clear()  # registration happens before serving: no watcher to tell

    # ----------------------------------------------------------------- request routing

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        match = _NAMESPACE_PATH.match(raw_request.path)
        if match is None:
            return await super().__call__(raw_request)
        request = await self._parse_namespace_request(raw_request, match)
        self._requests.append(request)
        try:
            return await self._handle(request)
        except rendering.StreamingError as e:  # the watch already sent headers: nothing to add
            return e.args[0]
        except Exception as e:  # rendered as a Status, as the parent does for other paths
            return await self._render_error(e)

    async def _parse_namespace_request(self, raw: aiohttp.web.BaseRequest, match: re.Match) -> rendering.Request:
        body = await raw.read()
        name, sub = match.group("name"), match.group("sub")
        method = raw.method.upper()
        if method == "GET":
            action = kmock.action.WATCH if raw.query.get("watch") == "true" else (
                kmock.action.FETCH if name else kmock.action.LIST)
        else:
            action = {"POST": kmock.action.CREATE, "PATCH": kmock.action.UPDATE,
                      "DELETE": kmock.action.DELETE}.get(method)
        return rendering.Request(
            id=len(self._requests), raw_request=raw, url=raw.url, method=raw.method,
            params=dict(raw.query), headers=dict(raw.headers), cookies=dict(raw.cookies),
            body=body, text=body.decode("utf-8", "replace"), data=json.loads(body) if body else None,
            action=action, resource=NAMESPACES, namespace=None, name=name, subresource=sub,
        )

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        res = request.resource
        if res is None or res.plural is None:  # discovery and non-Kubernetes paths
            return await kmock.KubernetesScaffold._handle(self, request)
        self._count(request)
        if self.authorize is not None and (denial := self.authorize(request)) is not None:
            raise api_error(403, "Forbidden", denial)
        method = request.method.value.upper()
        if (method, res.plural) in self.forbidden:
            raise api_error(403, "Forbidden", f'{res.plural}.{res.group or "core"} is forbidden: '
                            f'{method} is not granted to this client', kind=res.plural)
        if method in ("POST", "PUT", "PATCH", "DELETE"):
            # Writes are interpreted here, not by user reactions: tests drive the server through
            # its API only, so every write must follow the conventions.
            async with self._write_queue:
                if self.write_latency:
                    await asyncio.sleep(self.write_latency)
                async with self._lock:
                    try:
                        status, body = self._write(request, method)
                    finally:
                        await self._publish()
            return aiohttp.web.json_response(body, status=status)
        # Reads are served directly too: kmock's routing matches each request against its whole
        # request history, which grows with every call and made 100-job runs crawl.
        if request.action == kmock.action.WATCH:
            return await self._stream(request, self._serve_watch(request))
        if request.name is None:
            return aiohttp.web.json_response(await self._serve_list(request))
        return aiohttp.web.json_response(await self._serve_fetch(request))

    @staticmethod
    async def _stream(request: rendering.Request, events: AsyncIterator[Any]) -> aiohttp.web.StreamResponse:
        """A watch response: one JSON event per line, flushed as it happens, until either side stops."""
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request._raw_request)
        try:
            async for event in events:
                if event != b"":
                    await response.write(json.dumps(event).encode() + b"\n")
            await response.write_eof()
        except (ConnectionError, asyncio.CancelledError):
            pass  # the client went away (or the server is stopping): nothing left to send
        return response

    # ----------------------------------------------------------------- keys and lookups

    def _namespaced(self, res: Any, namespace: str | None) -> bool:
        if res in self.resources and self.resources[res].namespaced is not None:
            return bool(self.resources[res].namespaced)
        return namespace is not None

    def _key(self, res: Any, namespace: str | None, name: str) -> tuple:
        return (res, namespace if self._namespaced(res, namespace) else None, name)

    def _live(self, key: tuple) -> dict:
        if key not in self.objects or self.objects[key].deleted:
            res, _, name = key
            raise api_error(404, "NotFound", f'{res.plural}.{res.group or "core"} "{name}" not found',
                            name=name, kind=res.plural)
        return self.objects[key].raw

    def _kind(self, res: Any) -> str:
        info = self.resources[res] if res in self.resources else None
        return info.kind if info is not None and info.kind else res.plural.capitalize()

    def _has_status_subresource(self, res: Any) -> bool:
        return res in self.resources and "status" in self.resources[res].subresources

    # ----------------------------------------------------------------- discovery

    async def _serve_version(self, request: rendering.Request) -> rendering.Payload:
        """Discovery names the core group version "v1" and describes subresources as the API
        does: no short names or categories of their own (else kubectl finds "ns" ambiguous),
        and ``Scale`` of ``autoscaling/v1`` as the kind of scale (kubectl's scale client
        resolves it from here)."""
        payload = await super()._serve_version(request)
        if payload["groupVersion"].startswith("/"):  # the core group is "v1", not "/v1"
            payload["groupVersion"] = payload["groupVersion"][1:]
        for entry in payload["resources"]:
            if "/" in entry["name"]:
                entry.update(shortNames=[], categories=[], singularName="", verbs=["get", "patch", "update"])
            if entry["name"].endswith("/scale"):
                entry.update(kind="Scale", group="autoscaling", version="v1")
        return payload
