"""Requests counted per client from the API server's audit log (components.AUDIT_POLICY: every
request at Metadata level, one JSON event per line in ``Layout.audit_log``).

A window is two byte offsets of the log (:func:`mark` before, :func:`mark` after, or the end),
not two clock readings: the log is append-only and written in the order requests complete, so
an offset splits it exactly, where a timestamp would need the API server's clock and the
log's lag. A request counts in the window where its first event was written.

    start = mark(layout.audit_log)
    ... the work ...
    counts = count(requests(layout.audit_log, start), user=OPERATOR)  # Counter{(verb, resource): n}

The policy omits the RequestReceived stage; a watch (a long-running request) still logs two
events, ResponseStarted and ResponseComplete, with one audit ID: it counts once.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Request:
    """One request as the audit log records it."""

    audit_id: str
    user: str
    verb: str  # get, list, watch, create, update, patch, delete, deletecollection
    resource: str  # "pods", "ddpjobs"; "" for a non-resource URL (/healthz, /apis)
    api_group: str  # "" for the core group, "ddpjob.io", "policy", ... (what an RBAC rule names)
    subresource: str  # "status", "eviction", ""
    namespace: str
    name: str
    code: int  # the response's HTTP status (0 when the event carries none)
    uri: str  # the request's path and query: a watch's resourceVersion, a list's selector
    user_agent: str  # tells apart the clients of one user: kopf's from the operator's own


TAIL_BYTES = 1 << 16  # an event at Metadata level is well under this


def mark(path: Path) -> int:
    """The end of the log's last whole line: the start (or end) of a window; 0 while the log
    does not exist. A line the API server is still writing belongs to the next window."""
    try:
        with open(path, "rb") as log:
            size = log.seek(0, 2)
            start = max(0, size - TAIL_BYTES)
            log.seek(start)
            # Exactly up to the size seen: the API server appends between the two calls, and a
            # tail read to the new end, counted back from the old size, would land mid-line
            # (1,000 jobs on the real control plane did: "Extra data" in the next window's parse).
            tail = log.read(size - start)
    except FileNotFoundError:
        return 0
    last = tail.rfind(b"\n")
    if last < 0 and start > 0:
        raise ValueError(f"{path}: no line ends in its last {TAIL_BYTES} bytes; an audit event is longer than that")
    return start + last + 1


def requests(path: Path, start: int = 0, end: int | None = None) -> list[Request]:
    """The requests whose first event lies between offsets ``start`` and ``end`` (marks; the
    last whole line when None), in log order."""
    end = mark(path) if end is None else end
    with open(path, "rb") as log:
        log.seek(start)
        data = log.read(max(0, end - start))
    seen: set[str] = set()
    found = []
    for line in data.splitlines():
        event = json.loads(line)
        if event["auditID"] in seen:
            continue
        seen.add(event["auditID"])
        ref = event.get("objectRef") or {}
        found.append(Request(
            audit_id=event["auditID"], user=(event.get("user") or {}).get("username", ""), verb=event["verb"],
            resource=ref.get("resource", ""), api_group=ref.get("apiGroup", ""), subresource=ref.get("subresource", ""),
            namespace=ref.get("namespace", ""), name=ref.get("name", ""),
            code=(event.get("responseStatus") or {}).get("code", 0), uri=event.get("requestURI", ""),
            user_agent=event.get("userAgent", "")))
    return found


def count(found: list[Request], *, by: tuple[str, ...] = ("verb", "resource"), **where: object) -> Counter:
    """How many of ``found`` match every ``field=value`` of ``where``, grouped by the fields ``by``
    (a tuple of their values per key; a single field's value itself).

    >>> count(found, user="system:serviceaccount:ns:ddpjob-operator")[("watch", "pods")]
    """
    fields = Request.__dataclass_fields__
    unknown = [f for f in (*by, *where) if f not in fields]
    if unknown:
        raise ValueError(f"audit fields {unknown} unknown: a Request has {', '.join(fields)}")
    counts: Counter = Counter()
    for request in found:
        if all(getattr(request, f) == v for f, v in where.items()):
            key = tuple(getattr(request, f) for f in by)
            counts[key[0] if len(by) == 1 else key] += 1
    return counts
