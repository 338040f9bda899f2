"""A Kubernetes API server for tests: kmock's ``KubernetesEmulator`` plus the API conventions
that kopf, kubectl and the ddpjob operator rely on.

The stock emulator (kmock 0.8) stores objects and streams watch events, but treats every
write as a plain dict merge. This subclass keeps its storage (``emulator.objects`` with full
history, one ``aiobus.Bus`` per resource for watch fan-out, discovery, error rendering) and
replaces only how writes and reads are interpreted, following the API conventions
(https://github.com/kubernetes/community/blob/master/contributors/devel/sig-architecture/api-conventions.md):

* server-filled metadata on create: ``uid``, ``resourceVersion`` (one monotonic counter for
  the whole server, like etcd's revision), ``creationTimestamp``, ``generation``, ``generateName``;
* ``409 AlreadyExists`` on a duplicate create, ``409 Conflict`` when a write carries a stale
  ``metadata.resourceVersion`` (optimistic concurrency), ``422`` when a JSON-patch ``test`` fails;
* ``generation`` bumps when anything outside ``metadata`` and ``status`` changes;
* merge-patch, strategic-merge-patch (treated as merge-patch) and JSON-patch; PUT (replace);
* the ``status`` subresource (main-resource writes keep ``status``, status writes keep the rest)
  and the ``scale`` subresource (``autoscaling/v1`` Scale mapped onto the paths in the CRD);
* ``deletionTimestamp`` + finalizers: DELETE of an object with finalizers only marks it, and it
  disappears when the last finalizer is removed;
* background cascade deletion through ``ownerReferences`` (the garbage collector);
* label selectors (``a=b``, ``a==b``, ``a!=b``, ``a``, ``!a``, ``a in (x,y)``, ``a notin (x,y)``)
  and equality field selectors on any dotted path (``metadata.name``, ``involvedObject.uid``...)
  on list and watch;
* watch resumption from a ``resourceVersion`` (events replayed from a bounded log, 410 Gone
  when it is older than the log) and ``timeoutSeconds``;
* ``/api/v1/namespaces`` (which kmock's URL parser cannot read) with namespaces created
  implicitly on first use, as if an admin had created them;
* built-in resource discovery (kmock's bundled list) so kubectl and kopf find pods, services,
  events (core/v1 and events.k8s.io/v1), namespaces, CRDs and networkpolicies;
* ``forbidden``: (method, resource) pairs answered 403, as for a client whose RBAC lacks the grant.

* authorization, off unless a test sets ``authorize``: a request it refuses gets ``403 Forbidden``
  (tests/support/rbac.py decides as RBAC does, from a chart's rendered Roles).

Not emulated: admission, schema validation, defaulting, kubelet (pods never run: tests patch
their status like a kubelet would), pod grace periods (pods without finalizers disappear at
once), server-side apply, field managers, ``deletecollection``, chunked lists.
"""
from __future__ import annotations

import asyncio
import collections
import copy
import datetime
import json
import random
import re
import string
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any

import aiohttp.web
import attrs
import kmock
from kmock._internal import rendering

NAMESPACES = kmock.resource("", "v1", "namespaces")
CRDS = kmock.resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")

# How many events per resource are kept for watches that resume from a resourceVersion;
# an older resourceVersion gets "410 Gone", as etcd compaction causes on a real server.
WATCH_LOG_SIZE = 20_000

# kmock's path parser fails on "/api/v1/namespaces" and reads "/api/v1/namespaces/NAME" as a
# namespace without a resource, so these paths are recognised before it runs.
_NAMESPACE_PATH = re.compile(r"^/api/v1/namespaces(?:/(?P<name>[^/]+)(?:/(?P<sub>status|finalize))?)?/?$")

MERGE_PATCH_TYPES = ("application/merge-patch+json", "application/strategic-merge-patch+json")
JSON_PATCH_TYPE = "application/json-patch+json"


def api_error(status: int, reason: str, message: str, **details: Any) -> kmock.KubernetesError:
    """A ``Status`` failure as the API server returns it (``reason`` is the machine-readable cause)."""
    return kmock.KubernetesError(status=status, reason=reason, message=message, details=details or {})


def now_rfc3339() -> str:
    """Timestamps in the API are RFC 3339 in UTC with second precision."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@attrs.frozen
class ScalePaths:
    """Where the scale subresource reads and writes, as in a CRD's ``subresources.scale``."""

    spec_replicas: str = ".spec.replicas"
    status_replicas: str = ".status.replicas"
    label_selector: str | None = ".status.selector"


@attrs.define(kw_only=True)
class KubeEmulator(kmock.KubernetesEmulator):
    """kmock's emulator with the API conventions listed in the module docstring."""

    _revision: int = attrs.field(default=0, init=False)
    _log: dict[Any, collections.deque] = attrs.field(
        factory=lambda: collections.defaultdict(lambda: collections.deque(maxlen=WATCH_LOG_SIZE)), init=False)
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
    # (HTTP method, resource plural) pairs answered 403 Forbidden, as for a client whose RBAC
    # lacks the grant, e.g. ("POST", "networkpolicies"); tests may change it while serving.
    forbidden: set[tuple[str, str]] = attrs.field(factory=set)
    _write_queue: asyncio.Lock = attrs.field(factory=asyncio.Lock, init=False)  # reads do not wait on it
    # Authorization, off unless a test sets it: called with every resource request (discovery
    # is open to all, as on a real server); a message it returns is answered 403 Forbidden, the
    # way the API server answers a request its RBAC authorizer refuses.
    authorize: Callable[[rendering.Request], str | None] | None = None

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        # Discovery for the built-in resources (pods, services, events, namespaces, CRDs...).
        self.resources.load_bundled()
        for name in ("default", "kube-system"):
            self._store_new(NAMESPACES, None, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        self._pending.clear()  # nobody watches yet

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

    def _write(self, request: rendering.Request, method: str) -> tuple[int, dict]:
        if method == "POST":
            if request.name is not None:
                raise api_error(405, "MethodNotAllowed", f"POST is not supported on {request.url.path}")
            return 201, self._create(request.resource, request.namespace, request.data)
        if request.name is None:
            raise api_error(405, "MethodNotAllowed", f"{method} on a collection is not supported by the emulator")
        key = self._key(request.resource, request.namespace, request.name)
        if method == "DELETE":
            options = request.data if isinstance(request.data, dict) else {}
            policy = request.params.get("propagationPolicy") or options.get("propagationPolicy") or "Background"
            grace = request.params.get("gracePeriodSeconds", options.get("gracePeriodSeconds"))
            return 200, self._delete(key, options.get("preconditions") or {}, policy,
                                     None if grace is None else int(grace))
        if request.subresource == "scale":
            return 200, self._write_scale(key, request, method)
        return 200, self._update(key, request, method)

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

    # ----------------------------------------------------------------- writes

    def _next_revision(self) -> str:
        self._revision += 1
        return str(self._revision)

    def _create(self, res: Any, namespace: str | None, data: Any) -> dict:
        if not isinstance(data, dict) or not isinstance(data.get("metadata"), dict):
            raise api_error(400, "BadRequest", "the request body must be a JSON object with metadata")
        body = copy.deepcopy(data)
        meta = body["metadata"]
        if namespace is not None and meta.get("namespace") not in (None, namespace):
            raise api_error(400, "BadRequest",
                            f"the namespace of the provided object ({meta['namespace']}) does not match "
                            f"the namespace sent on the request ({namespace})")
        name = meta.get("name") or self._generate_name(res, namespace, meta.get("generateName"))
        key = self._key(res, namespace or meta.get("namespace"), name)
        if key in self.objects and not self.objects[key].deleted:
            raise api_error(409, "AlreadyExists", f'{res.plural} "{name}" already exists', name=name, kind=res.plural)
        if self._has_status_subresource(res):
            body.pop("status", None)  # status is written through its own endpoint only
        self._store_new(res, key[1], body, name=name)
        return self.objects[key].raw

    def _generate_name(self, res: Any, namespace: str | None, prefix: str | None) -> str:
        if not prefix:
            raise api_error(422, "Invalid", "metadata.name: Required value: name or generateName is required")
        while True:  # the server appends 5 random characters to generateName
            name = prefix + "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
            key = self._key(res, namespace, name)
            if key not in self.objects or self.objects[key].deleted:
                return name

    def _store_new(self, res: Any, namespace: str | None, body: dict, name: str | None = None) -> None:
        meta = body.setdefault("metadata", {})
        meta["name"] = name or meta["name"]
        if self._namespaced(res, namespace):
            meta["namespace"] = namespace
            self._ensure_namespace(namespace)
        else:
            meta.pop("namespace", None)
        for field in ("deletionTimestamp", "deletionGracePeriodSeconds"):
            meta.pop(field, None)
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=now_rfc3339(), generation=1,
                    resourceVersion=self._next_revision())
        body.setdefault("apiVersion", f"{res.group}/{res.version}" if res.group else res.version)
        body.setdefault("kind", self._kind(res))
        key = (res, meta.get("namespace"), meta["name"])
        if key in self.objects:
            self.objects[key].create(body)
        else:
            self.objects[key] = body
        self._emit(res, "ADDED", self.objects[key].raw)

    def _ensure_namespace(self, namespace: str) -> None:
        if (NAMESPACES, None, namespace) in self.objects and not self.objects[NAMESPACES, None, namespace].deleted:
            return
        self._store_new(NAMESPACES, None, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace},
                                           "status": {"phase": "Active"}})

    def _update(self, key: tuple, request: rendering.Request, method: str) -> dict:
        old = self._live(key)
        if method == "PUT":
            if not isinstance(request.data, dict):
                raise api_error(400, "BadRequest", "PUT needs the whole object as a JSON object")
            changed = copy.deepcopy(request.data)
        else:
            changed = apply_patch(old, request.data, request.headers.get("Content-Type", ""))
        new = self._merge_by_subresource(key[0], old, changed, request.subresource)
        return self._replace(key, old, new)

    def _merge_by_subresource(self, res: Any, old: dict, changed: dict, subresource: str | None) -> dict:
        """A status write changes only ``status``; a main write keeps ``status`` where it is a subresource."""
        if subresource == "status":
            new = copy.deepcopy(old)
            new["status"] = changed.get("status")
            new["metadata"]["resourceVersion"] = changed.get("metadata", {}).get(
                "resourceVersion", old["metadata"]["resourceVersion"])
            if new["status"] is None:
                del new["status"]
            return new
        if subresource is not None:
            raise api_error(404, "NotFound", f"subresource {subresource!r} is not served by the emulator")
        if self._has_status_subresource(res):
            changed.pop("status", None)
            if "status" in old:
                changed["status"] = copy.deepcopy(old["status"])
        return changed

    def _replace(self, key: tuple, old: dict, new: dict) -> dict:
        """Stores ``new`` over ``old`` after the precondition and immutable-field checks."""
        res, _, name = key
        meta, old_meta = new.setdefault("metadata", {}), old["metadata"]
        sent_version = meta.get("resourceVersion")
        if sent_version not in (None, "", old_meta["resourceVersion"]):
            raise api_error(409, "Conflict",
                            f'Operation cannot be fulfilled on {res.plural} "{name}": the object has been '
                            f"modified; please apply your changes to the latest version and try again",
                            name=name, kind=res.plural)
        for field in ("uid", "name", "namespace", "creationTimestamp", "deletionTimestamp",
                      "deletionGracePeriodSeconds", "generation", "resourceVersion"):
            if field in old_meta:
                meta[field] = old_meta[field]
            else:
                meta.pop(field, None)
        new.setdefault("apiVersion", old.get("apiVersion"))
        new.setdefault("kind", old.get("kind"))
        if new == old:  # a no-op write keeps the resourceVersion and sends no event
            return old
        if _without_meta_and_status(new) != _without_meta_and_status(old):
            meta["generation"] = int(old_meta.get("generation", 1)) + 1
        meta["resourceVersion"] = self._next_revision()
        self.objects[key].history.append(new)
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            return self._remove(key, "Background")
        self._emit(res, "MODIFIED", new)
        return self.objects[key].raw

    def _write_scale(self, key: tuple, request: rendering.Request, method: str) -> dict:
        paths = self._scale_paths(key[0])
        old = self._live(key)
        current = self._scale_of(key[0], old)
        if method == "PUT":
            changed = request.data if isinstance(request.data, dict) else {}
        else:
            changed = apply_patch(current, request.data, request.headers.get("Content-Type", ""))
        replicas = changed.get("spec", {}).get("replicas")
        if not isinstance(replicas, int) or replicas < 0:
            raise api_error(422, "Invalid", f"spec.replicas: Invalid value: {replicas!r}: must be an integer >= 0")
        new = copy.deepcopy(old)
        _set_path(new, paths.spec_replicas, replicas)
        new["metadata"]["resourceVersion"] = changed.get("metadata", {}).get("resourceVersion")
        return self._scale_of(key[0], self._replace(key, old, new))

    def _delete(self, key: tuple, preconditions: Mapping[str, Any], policy: str, grace: int | None = None) -> dict:
        obj = self._live(key)
        for field in ("uid", "resourceVersion"):
            if preconditions.get(field) not in (None, obj["metadata"].get(field)):
                raise api_error(409, "Conflict", f"Precondition failed: {field} in precondition: "
                                f"{preconditions[field]}, {field} in object meta: {obj['metadata'].get(field)}")
        if obj["metadata"].get("deletionTimestamp"):
            if grace == 0 and not obj["metadata"].get("finalizers") and self._kind(key[0]) == "Pod":
                return self._remove(key, policy)  # a force delete ends the wait for the kubelet
            return obj
        wait = self._pod_grace(key, obj, grace)
        if wait:
            new = copy.deepcopy(obj)
            deadline = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=wait)
            new["metadata"].update(deletionTimestamp=deadline.strftime("%Y-%m-%dT%H:%M:%SZ"),
                                   deletionGracePeriodSeconds=wait, resourceVersion=self._next_revision())
            self.objects[key].history.append(new)
            self._emit(key[0], "MODIFIED", new)
            return new
        if obj["metadata"].get("finalizers"):
            # Finalizers hold the object: it is only marked, and goes when they are all removed.
            new = copy.deepcopy(obj)
            new["metadata"].update(deletionTimestamp=now_rfc3339(), deletionGracePeriodSeconds=0,
                                   resourceVersion=self._next_revision())
            self.objects[key].history.append(new)
            self._emit(key[0], "MODIFIED", new)
            return new
        return self._remove(key, policy)

    def _pod_grace(self, key: tuple, obj: dict, grace: int | None) -> int:
        """Seconds a graceful pod deletion waits (0: remove at once, as for an unscheduled pod)."""
        if not self.graceful_pod_deletion or self._kind(key[0]) != "Pod" or not obj.get("spec", {}).get("nodeName"):
            return 0
        return int(obj["spec"].get("terminationGracePeriodSeconds", 30) if grace is None else grace)

    def _remove(self, key: tuple, policy: str) -> dict:
        last = copy.deepcopy(self.objects[key].last.raw)
        last["metadata"]["resourceVersion"] = self._next_revision()
        self.objects[key].delete()
        self._emit(key[0], "DELETED", last)
        if policy != "Orphan":
            # The garbage collector removes dependents after the owner is gone ("Background");
            # "Foreground" is treated the same way.
            self._spawn(self._collect_dependents(last["metadata"]["uid"]))
        return last

    async def _collect_dependents(self, owner_uid: str) -> None:
        async with self._lock:
            live_uids = {obj.raw["metadata"].get("uid") for obj in self.objects.values() if not obj.deleted}
            for key, obj in list(self.objects.items()):
                if obj.deleted:
                    continue
                owners = [ref.get("uid") for ref in obj.raw["metadata"].get("ownerReferences") or []]
                if owner_uid in owners and not any(uid in live_uids for uid in owners):
                    self._delete(key, {}, "Background")
            await self._publish()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _emit(self, res: Any, event_type: str, body: dict) -> None:
        """Records a watch event; ``_publish`` sends it, still under the lock, so order is kept."""
        event = {"type": event_type, "object": copy.deepcopy(body)}
        self._log[res].append((int(body["metadata"]["resourceVersion"]), event))
        self._pending.append((res, event))

    async def _publish(self) -> None:
        pending, self._pending = self._pending, []
        for res, event in pending:
            await self._buses[res].put(event)

    # ----------------------------------------------------------------- scale

    def _scale_paths(self, res: Any) -> ScalePaths:
        if res not in self._scales:
            raise api_error(404, "NotFound", f"{res.plural} has no scale subresource")
        return self._scales[res]

    def _scale_of(self, res: Any, obj: dict) -> dict:
        paths = self._scale_paths(res)
        meta = obj["metadata"]
        status: dict[str, Any] = {"replicas": _get_path(obj, paths.status_replicas) or 0}
        selector = _get_path(obj, paths.label_selector) if paths.label_selector else None
        if selector:
            status["selector"] = selector
        return {
            "apiVersion": "autoscaling/v1", "kind": "Scale",
            "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                         if k in meta},
            "spec": {"replicas": _get_path(obj, paths.spec_replicas) or 0},
            "status": status,
        }

    # ----------------------------------------------------------------- reads

    def _matching(self, request: rendering.Request) -> Iterable[dict]:
        selector = parse_label_selector(request.params.get("labelSelector", ""))
        fields = parse_field_selector(request.params.get("fieldSelector", ""))
        for (res, namespace, name), obj in self.objects.items():
            if res != request.resource or obj.deleted:
                continue
            if request.namespace is not None and namespace != request.namespace:
                continue
            if request.name is not None and name != request.name:
                continue
            body = obj.raw
            if selector(body) and fields(body):
                yield body

    async def _serve_list(self, request: rendering.Request) -> rendering.Payload:
        if request.resource not in self.resources and not any(r == request.resource for r, _, _ in self.objects):
            raise api_error(404, "NotFound", f"the server could not find the requested resource ({request.resource})")
        async with self._lock:
            items = [copy.deepcopy(body) for body in self._matching(request)]
            revision = str(self._revision)
        res = request.resource
        return {
            "apiVersion": f"{res.group}/{res.version}" if res.group else res.version,
            "kind": f"{self._kind(res)}List",
            "metadata": {"resourceVersion": revision, "continue": ""},
            "items": items,
        }

    async def _serve_fetch(self, request: rendering.Request) -> rendering.Payload:
        async with self._lock:
            key = self._key(request.resource, request.namespace, request.name)
            body = copy.deepcopy(self._live(key))
        if request.subresource == "scale":
            return self._scale_of(request.resource, body)
        if request.subresource not in (None, "status"):
            raise api_error(404, "NotFound", f"subresource {request.subresource!r} is not served by the emulator")
        return body

    async def _serve_watch(self, request: rendering.Request) -> AsyncIterator[rendering.Payload]:
        yield b""  # send the headers now: the stream may stay quiet for a long time
        selector = parse_label_selector(request.params.get("labelSelector", ""))
        fields = parse_field_selector(request.params.get("fieldSelector", ""))
        timeout = float(request.params["timeoutSeconds"]) if request.params.get("timeoutSeconds") else None
        bus = self._buses[request.resource]
        async with self._lock:
            marker = await bus.mark()  # every event after this point reaches the stream below
            initial = self._initial_watch_events(request)
        try:
            for event in initial:
                if self._event_matches(request, event, selector, fields):
                    yield event
                if event["type"] == "ERROR":  # the server ends a watch after an error event
                    return
            try:
                async with asyncio.timeout(timeout):
                    async for event in bus.stream(since=marker):
                        if self._event_matches(request, event, selector, fields):
                            yield event
            except TimeoutError:
                return
        finally:
            await bus.unmark(marker)

    def _initial_watch_events(self, request: rendering.Request) -> list[dict]:
        since = request.params.get("resourceVersion")
        if since in (None, "", "0"):  # "get state and start at most recent"
            return [{"type": "ADDED", "object": copy.deepcopy(obj.raw)}
                    for (res, _, _), obj in self.objects.items() if res == request.resource and not obj.deleted]
        log = self._log[request.resource]
        if len(log) == log.maxlen and log[0][0] > int(since) + 1:
            return [{"type": "ERROR", "object": {"apiVersion": "v1", "kind": "Status", "status": "Failure",
                                                 "code": 410, "reason": "Expired",
                                                 "message": f"too old resource version: {since}"}}]
        return [copy.deepcopy(event) for revision, event in log if revision > int(since)]

    @staticmethod
    def _event_matches(request: rendering.Request, event: dict, selector: Any, fields: Any) -> bool:
        body = event["object"]
        if event["type"] == "ERROR":
            return True
        meta = body.get("metadata", {})
        if request.namespace is not None and meta.get("namespace") != request.namespace:
            return False
        if request.name is not None and meta.get("name") != request.name:
            return False
        return selector(body) and fields(body)

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


# --------------------------------------------------------------------- pure helpers


def _without_meta_and_status(body: dict) -> dict:
    return {k: v for k, v in body.items() if k not in ("metadata", "status")}


def _get_path(body: Mapping[str, Any], path: str | None) -> Any:
    value: Any = body
    for part in (path or "").strip(".").split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def _set_path(body: dict, path: str, value: Any) -> None:
    *parents, last = path.strip(".").split(".")
    for part in parents:
        body = body.setdefault(part, {})
    body[last] = value


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: dicts merge recursively, ``null`` removes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def json_patch(target: Any, operations: list[dict]) -> Any:
    """RFC 6902 JSON patch (add, remove, replace, test, move, copy); a failed ``test`` is a 422."""
    doc = copy.deepcopy(target)
    for op in operations:
        path = _pointer(op["path"])
        if op["op"] == "test":
            if _pointer_get(doc, path) != op.get("value"):
                raise api_error(422, "Invalid", f"the server rejected our request: test failed at {op['path']}: "
                                f"{_pointer_get(doc, path)!r} != {op.get('value')!r}")
        elif op["op"] in ("add", "replace"):
            doc = _pointer_set(doc, path, copy.deepcopy(op["value"]), insert=op["op"] == "add")
        elif op["op"] == "remove":
            doc = _pointer_remove(doc, path)
        elif op["op"] in ("move", "copy"):
            source = _pointer(op["from"])
            value = copy.deepcopy(_pointer_get(doc, source))
            if op["op"] == "move":
                doc = _pointer_remove(doc, source)
            doc = _pointer_set(doc, path, value, insert=True)
        else:
            raise api_error(422, "Invalid", f"unsupported JSON-patch op {op['op']!r}")
    return doc


def _pointer(path: str) -> list[str]:
    return [part.replace("~1", "/").replace("~0", "~") for part in path.split("/")[1:]] if path else []


def _pointer_get(doc: Any, path: list[str]) -> Any:
    for part in path:
        try:
            doc = doc[int(part)] if isinstance(doc, list) else doc[part]
        except (KeyError, IndexError, ValueError, TypeError):
            return None
    return doc


def _pointer_parent(doc: Any, path: list[str]) -> Any:
    parent = _pointer_get(doc, path[:-1])
    if not isinstance(parent, (dict, list)):
        raise api_error(422, "Invalid", f"JSON-patch path /{'/'.join(path)} has no parent")
    return parent


def _pointer_set(doc: Any, path: list[str], value: Any, insert: bool) -> Any:
    if not path:
        return value
    parent, last = _pointer_parent(doc, path), path[-1]
    if isinstance(parent, list):
        index = len(parent) if last == "-" else int(last)
        parent.insert(index, value) if insert else parent.__setitem__(index, value)
    else:
        parent[last] = value
    return doc


def _pointer_remove(doc: Any, path: list[str]) -> Any:
    parent, last = _pointer_parent(doc, path), path[-1]
    try:
        del parent[int(last) if isinstance(parent, list) else last]
    except (KeyError, IndexError, ValueError):
        raise api_error(422, "Invalid", f"JSON-patch cannot remove /{'/'.join(path)}: it does not exist") from None
    return doc


def apply_patch(target: dict, patch: Any, content_type: str) -> dict:
    """Applies a PATCH body by its content type (strategic merge is treated as a merge patch)."""
    kind = content_type.split(";")[0].strip().lower()
    if kind == JSON_PATCH_TYPE:
        if not isinstance(patch, list):
            raise api_error(400, "BadRequest", "a JSON patch must be a list of operations")
        return json_patch(target, patch)
    if kind in MERGE_PATCH_TYPES:
        if not isinstance(patch, dict):
            raise api_error(400, "BadRequest", "a merge patch must be a JSON object")
        return merge_patch(target, patch)
    raise api_error(415, "UnsupportedMediaType", f"the emulator does not support patch type {content_type!r}")


_REQUIREMENT = re.compile(
    r"\s*(?P<neg>!)?\s*(?P<key>[A-Za-z0-9./_-]+)\s*"
    r"(?:(?P<op>==|=|!=)\s*(?P<value>[A-Za-z0-9._-]*)|\s+(?P<setop>in|notin)\s*\((?P<values>[^)]*)\))?\s*(?:,|$)")


def parse_label_selector(text: str):
    """A predicate over objects for a label selector string (equality- and set-based)."""
    requirements = []
    position = 0
    while position < len(text):
        match = _REQUIREMENT.match(text, position)
        if match is None or match.end() == position:
            raise api_error(400, "BadRequest", f"unable to parse label selector {text!r} at position {position}")
        requirements.append(_requirement(match))
        position = match.end()

    def matches(body: Mapping[str, Any]) -> bool:
        labels = body.get("metadata", {}).get("labels") or {}
        return all(requirement(labels) for requirement in requirements)

    return matches


def _requirement(match: re.Match):
    key, neg = match.group("key"), bool(match.group("neg"))
    if match.group("setop"):
        values = {v.strip() for v in match.group("values").split(",") if v.strip()}
        if match.group("setop") == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    if match.group("op") in ("=", "=="):
        return lambda labels: labels.get(key) == match.group("value")
    if match.group("op") == "!=":
        return lambda labels: labels.get(key) != match.group("value")
    return (lambda labels: key not in labels) if neg else (lambda labels: key in labels)


def parse_field_selector(text: str):
    """A predicate for a field selector. The API allows a few fields per resource (metadata.name
    and metadata.namespace everywhere, involvedObject.* on events, status.phase on pods...); the
    emulator accepts any dotted path, a superset that serves ``kubectl describe``'s event query."""
    requirements = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        match = re.fullmatch(r"(?P<path>[A-Za-z][A-Za-z0-9.]*)\s*(?P<op>==|=|!=)\s*(?P<value>.*)", part)
        if match is None:
            raise api_error(400, "BadRequest", f'unable to parse field selector requirement "{part}"')
        requirements.append(match.groupdict())

    def matches(body: Mapping[str, Any]) -> bool:
        for req in requirements:
            equal = str(_get_path(body, req["path"]) or "") == req["value"]
            if equal != (req["op"] != "!="):
                return False
        return True

    return matches
