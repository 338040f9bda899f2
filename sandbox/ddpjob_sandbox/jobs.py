"""The one DDPJob builder of the tests and benchmarks.

``make_spec(replicas=3)`` gives a valid spec; keyword arguments (camelCase spec fields)
change one thing each, so a caller states only what matters to it. The body comes in two
shapes, both built from that spec:

* :func:`make_ddpjob`: as the API server hands it to the operator (uid, namespace,
  generation, status), for the operator's pure tests;
* :func:`make_manifest`: as a user applies it (no server-filled fields), at test speed (a
  short run, failure backoffs of seconds), for tests and benchmarks that create it through
  the API.

The shipped examples at test speed are ddpjob_sandbox.examples'.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from ddpjob_operator.api import constants as C
from ddpjob_operator.render.node_pod import snapshot_subpath

IMAGE = "ghcr.io/ddpjob/trainer:0.1.0"
MODULE = "ddpjob_trainer.examples.mlp"
# A crash loop replaced after 1-2 s instead of the default backoff's 10 s and more: failure tests stay fast.
FAST_FAILURE_POLICY = {"maxRestarts": 3, "backoffSeconds": 1, "maxBackoffSeconds": 2}
SHORT_RUN_ARGS = ["--epochs", "2"]  # the trainer's arguments in an applied manifest (pods never run it)


def make_spec(*, replicas: int | None = 2, min_replicas: int | None = None,
              max_replicas: int | None = None, **fields: Any) -> dict[str, Any]:
    """A valid spec dict; keyword arguments (camelCase spec fields) override or add fields."""
    spec: dict[str, Any] = {"image": IMAGE, "module": MODULE}
    if replicas is not None:
        spec["replicas"] = replicas
    elastic = dict(fields.pop("elasticPolicy", {}))
    if min_replicas is not None:
        elastic["minReplicas"] = min_replicas
    if max_replicas is not None:
        elastic["maxReplicas"] = max_replicas
    if elastic:
        spec["elasticPolicy"] = elastic
    spec.update(fields)
    return spec


def make_ddpjob(name: str = "mlp", *, namespace: str = "default", uid: str = "uid-mlp",
                generation: int = 1, status: dict[str, Any] | None = None,
                **spec_fields: Any) -> dict[str, Any]:
    """A DDPJob body (metadata, spec, status) as the API server would hand it over."""
    body = _body(name, make_spec(**spec_fields))
    body["metadata"].update(namespace=namespace, uid=uid, generation=generation)
    body["status"] = copy.deepcopy(status) if status else {}
    return body


def make_manifest(name: str = "mlp", *, replicas: int | None = 2, **spec_fields: Any) -> dict[str, Any]:
    """A DDPJob as a user applies it, with SHORT_RUN_ARGS and FAST_FAILURE_POLICY unless given."""
    spec_fields.setdefault("args", list(SHORT_RUN_ARGS))
    spec_fields.setdefault("failurePolicy", dict(FAST_FAILURE_POLICY))
    return _body(name, make_spec(replicas=replicas, **spec_fields))


def _body(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": C.API_VERSION, "kind": C.KIND, "metadata": {"name": name}, "spec": spec}


def job_snapshot_dir(claim_dir: Path, job: str) -> Path:
    """Where DDPJob ``job``'s pods see a snapshot volume whose directory is ``claim_dir``: the job's
    own directory of it (render.node_pod.snapshot_subpath), where its metrics.jsonl lies too."""
    return claim_dir / snapshot_subpath(job)
