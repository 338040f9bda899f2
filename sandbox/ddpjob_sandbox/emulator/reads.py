"""How the emulator serves reads (list, get, watch), as a mixin of KubeEmulator.

Reads are served directly rather than through kmock's routing, which matches each request
against the whole request history and made 100-job runs crawl.
"""
from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator, Iterable
from typing import Any

from kmock._internal import rendering

from ddpjob_sandbox.emulator.common import api_error
from ddpjob_sandbox.emulator.selectors import parse_field_selector, parse_label_selector


class Reads:
    """The read half of :class:`ddpjob_sandbox.emulator.server.KubeEmulator` (its state lives there)."""

    __slots__ = ()

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
                        if event["type"] == "ERROR":  # expire_watches(): this watch is over
                            return
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
        if (len(log) == log.maxlen and log[0][0] > int(since) + 1) or int(since) < self._compacted.get(
                request.resource, 0):
            return [_gone(f"too old resource version: {since}")]
        return [copy.deepcopy(event) for revision, event in log if revision > int(since)]

    def expire(self, plural: str) -> None:
        """``expire_watches`` from another thread (a test's): waits until it is done."""
        asyncio.run_coroutine_threadsafe(self.expire_watches(plural), self._serving_loop).result(timeout=10)

    async def expire_watches(self, plural: str) -> None:
        """Ends every open watch of ``plural`` with 410 Gone and forgets the events they could resume
        from, as an API server does after etcd compacts the revisions a watcher still needed: the
        client must list again. Call on the emulator's event loop."""
        async with self._lock:
            for res in [r for r in {*self._log, *self._buses} if r.plural == plural]:
                self._log[res].clear()
                self._compacted[res] = self._revision  # a list made now resumes from here
                await self._buses[res].put(_gone(f"the watch of {plural} expired: the server compacted its events"))

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


def _gone(message: str) -> dict:
    """The ERROR event that tells a watcher its resourceVersion is no longer served (410 Gone)."""
    return {"type": "ERROR", "object": {"apiVersion": "v1", "kind": "Status", "status": "Failure",
                                        "code": 410, "reason": "Expired", "message": message}}
