"""What every part of the emulator shares: API errors, timestamps, well-known resources, dotted paths."""
from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

import attrs
import kmock

NAMESPACES = kmock.resource("", "v1", "namespaces")
CRDS = kmock.resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")


def api_error(status: int, reason: str, message: str, **details: Any) -> kmock.KubernetesError:
    """A ``Status`` failure as the API server returns it (``reason`` is the machine-readable cause)."""
    return kmock.KubernetesError(status=status, reason=reason, message=message, details=details or {})


@attrs.frozen
class Refusal:
    """How the emulator answers creates that a test wants refused, as admission would."""

    status: int  # 403 (ResourceQuota, PodSecurity), 422 (an invalid object), 429, 500 (a failing webhook)...
    reason: str  # the Status reason: Forbidden, Invalid, TooManyRequests, InternalError
    message: str  # "{name}" becomes the object's name
    retry_after: int | None = None  # details.retryAfterSeconds, as the API server sends with 429


def quota_refusal(quota: str = "compute", resource: str = "pods", used: int = 1, limit: int = 1) -> Refusal:
    """What the ResourceQuota admission plugin answers when a create would exceed the quota."""
    return Refusal(403, "Forbidden", f'{resource} "{{name}}" is forbidden: exceeded quota: {quota}, '
                   f"requested: {resource}=1, used: {resource}={used}, limited: {resource}={limit}")


def now_rfc3339() -> str:
    """Timestamps in the API are RFC 3339 in UTC with second precision."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@attrs.frozen
class ScalePaths:
    """Where the scale subresource reads and writes, as in a CRD's ``subresources.scale``."""

    spec_replicas: str = ".spec.replicas"
    status_replicas: str = ".status.replicas"
    label_selector: str | None = ".status.selector"


def get_path(body: Mapping[str, Any], path: str | None) -> Any:
    """The value at a dotted path (".spec.replicas"), None where any part is missing."""
    value: Any = body
    for part in (path or "").strip(".").split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def set_path(body: dict, path: str, value: Any) -> None:
    """Sets the value at a dotted path, creating the dicts on the way."""
    *parents, last = path.strip(".").split(".")
    for part in parents:
        body = body.setdefault(part, {})
    body[last] = value
