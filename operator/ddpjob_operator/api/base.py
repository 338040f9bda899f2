"""What the spec and status models share: how a field is written, and a passed-through object.

A leaf of api/: the status model (status.py) needs these and nothing of the spec's.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

# A Kubernetes object this API passes through unchanged (affinity, a volume source, ...):
# typed loosely on purpose, the API server validates it when the pod is created.
KubeObject = dict[str, Any]


class ApiModel(BaseModel):
    """camelCase on the wire, snake_case in Python; unknown fields are errors (typos).

    Strict: the API server's schema refuses `replicas: true` or "2" and a string given as a
    number, so the operator and `ddpjob validate` do too. (A whole float such as 2.0 reaches
    the API server as 2, because kubectl writes JSON with Go's encoder; `ddpjob validate`
    reads YAML the same way: see cli._KubectlLoader.)
    """

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", strict=True)
