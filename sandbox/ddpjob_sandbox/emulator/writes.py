"""How the emulator interprets writes (create, update, patch, scale, delete), as a mixin of KubeEmulator.

Every write runs under the server's lock and records its watch events, which ``_publish``
sends in order once the write is done; see the package docstring for the conventions.
"""
from __future__ import annotations

import asyncio
import copy
import datetime
import random
import string
import uuid
from collections.abc import Mapping
from typing import Any

from kmock._internal import rendering

from ddpjob_sandbox.emulator.common import NAMESPACES, ScalePaths, api_error, get_path, now_rfc3339, set_path
from ddpjob_sandbox.emulator.patches import apply_patch


class Writes:
    """The write half of :class:`ddpjob_sandbox.emulator.server.KubeEmulator` (its state lives there)."""

    __slots__ = ()

    def _write(self, request: rendering.Request, method: str) -> tuple[int, dict]:
        if method == "POST":
            if request.name is not None:
                raise api_error(405, "MethodNotAllowed", f"POST is not supported on {request.url.path}")
            self._admit(request)
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
        set_path(new, paths.spec_replicas, replicas)
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
        status: dict[str, Any] = {"replicas": get_path(obj, paths.status_replicas) or 0}
        selector = get_path(obj, paths.label_selector) if paths.label_selector else None
        if selector:
            status["selector"] = selector
        return {
            "apiVersion": "autoscaling/v1", "kind": "Scale",
            "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                         if k in meta},
            "spec": {"replicas": get_path(obj, paths.spec_replicas) or 0},
            "status": status,
        }


def _without_meta_and_status(body: dict) -> dict:
    return {k: v for k, v in body.items() if k not in ("metadata", "status")}

