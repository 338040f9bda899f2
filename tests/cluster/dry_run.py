"""A server-side dry run, what `kubectl create --dry-run=server --validate=strict` sends: the real
API server decodes, defaults, validates and admits the object (Pod Security, ServiceAccount,
Priority, a CRD's schema and CEL rules) as it would for a create, and stores nothing."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ddpjob_sandbox.client import ApiError, KubeClient


def refusal(kube: KubeClient, resource: str, body: Mapping[str, Any], namespace: str | None = None) -> ApiError | None:
    """The API server's refusal to create ``body`` as a ``resource`` (an unknown field is refused
    too: strict field validation), or None where it would create it."""
    try:
        kube.request("POST", kube.path(resource, namespace=namespace), body,
                     params={"dryRun": "All", "fieldValidation": "Strict"})
    except ApiError as e:
        return e
    return None
