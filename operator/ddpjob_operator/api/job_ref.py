"""Identity of a DDPJob object, read from its metadata: what names, labels and ownerReferences need.

Its own module because nearly every room takes a JobRef (render names and labels objects with it,
decide and the controller address the job), while only validation parses the spec beside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping


@dataclass(frozen=True)
class JobRef:
    """Identity of a DDPJob object: what names, labels and ownerReferences need."""

    name: str
    namespace: str = "default"
    uid: str = ""
    generation: int = 0
    created: str | None = None  # metadata.creationTimestamp: snapshots older than it are an earlier job's

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> JobRef:
        meta = body.get("metadata") or {}
        return cls(name=meta.get("name", ""), namespace=meta.get("namespace") or "default",
                   uid=meta.get("uid", ""), generation=int(meta.get("generation") or 0),
                   created=meta.get("creationTimestamp"))

