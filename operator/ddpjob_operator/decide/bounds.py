"""The status cut to the bounds the CRD enforces, before it is written (pure).

Pods answer the progress poll, write termination messages and fail with messages; the scheduler,
the kubelet and the API server add reasons and messages of their own. Each list and string of
the status that they can grow has a maxItems or maxLength in the status schema (api/status.py,
from the constants "What a pod or the cluster can grow in the status"), so the API server
refuses a status past it. The policies keep their own, smaller bounds where they choose what to
keep (failures, avoidedNodes, invalidProgressRecords); :func:`bounded` is the last word, read
from the very schema the CRD is generated from, so that a status write never meets that refusal.
A refused write would stop the job's reconciliation for good: each pass computes the same status
and writes it again. Past etcd's object limit (1.5 MiB) the same happens with no schema at all.

What is cut: a list keeps its last (newest) entries, a string its start and "..." at the end.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping

from ddpjob_operator.api.crd import open_api_schema

CUT = "..."  # marks a string cut to its bound


@functools.lru_cache(maxsize=1)
def status_schema() -> Mapping[str, Any]:
    """The structural schema of .status, as the CRD carries it."""
    return open_api_schema()["properties"]["status"]


def bounded(status: Mapping[str, Any]) -> dict[str, Any]:
    """``status`` with every list and string within its schema's maxItems and maxLength."""
    return _bound(dict(status), status_schema())


def cut(text: str, limit: int) -> str:
    """``text`` in at most ``limit`` characters, its end replaced by CUT when it had to be cut."""
    return text if len(text) <= limit else text[:max(limit - len(CUT), 0)] + CUT[:limit]


def _bound(value: Any, schema: Mapping[str, Any]) -> Any:
    if isinstance(value, str) and "maxLength" in schema:
        return cut(value, schema["maxLength"])
    if isinstance(value, list):
        kept = value[-schema["maxItems"]:] if "maxItems" in schema else value
        return [_bound(item, schema.get("items") or {}) for item in kept]
    if isinstance(value, Mapping) and "properties" in schema:
        fields = schema["properties"]
        return {key: _bound(item, fields.get(key) or {}) for key, item in value.items()}
    return value
