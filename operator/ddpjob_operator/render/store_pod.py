"""The dedicated c10d rendezvous store: one small pod and a Service in front of it.

With c10d (unless `spec.elasticPolicy.rdzvStore: node`) no training node hosts torch's c10d TCPStore;
a pod `<job>-rdzv` runs `python -m ddpjob_trainer.store_server` (the trainer image, so
the store speaks exactly the torch version of the agents) and every agent joins as a
client (`is_host=false` in PET_RDZV_CONF). Losing any training node then replaces only
that node; losing the store loses the rendezvous state, which topology.py turns into a
whole-group restart under a new rendezvous id.

Pure: the pod and Service come back as dicts for kube.py to create.
"""

from __future__ import annotations

from typing import Any

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.names import rdzv_store_name
from ddpjob_operator.render.kueue import companion_queue_labels
from ddpjob_operator.render.common import (
    borrowed_scheduling, common_labels, companion_pod, companion_service, restricted_container, service_account,
    trainer_pod_security,
)
from ddpjob_operator.api.job_ref import JobRef
from ddpjob_operator.api.spec import DDPJobSpec

# Enough for a TCPStore holding a few hundred rendezvous keys; torch's import dominates.
STORE_RESOURCES = {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}}


def store_labels(job: str) -> dict[str, str]:
    """Labels of the store pod and Service; the job-name label lets the operator's pod
    watch and list see the store, the component label tells it apart from node pods."""
    return {**common_labels(job), C.LABEL_COMPONENT: C.COMPONENT_RDZV_STORE}




def render_store_service(ref: JobRef, spec: DDPJobSpec) -> dict[str, Any]:
    """The Service agents reach the store through, across store replacements."""
    port = spec.elastic_policy.rdzv_port
    selector = {C.LABEL_JOB_NAME: ref.name, C.LABEL_COMPONENT: C.COMPONENT_RDZV_STORE}
    return companion_service(ref, rdzv_store_name(ref.name), store_labels(ref.name), selector,
                             C.RDZV_PORT_NAME, port)


def render_store_pod(ref: JobRef, spec: DDPJobSpec) -> dict[str, Any]:
    """The store pod; it shares the node pods' scheduling and pull settings, not their resources."""
    port = spec.elastic_policy.rdzv_port
    container = {
        "name": C.RDZV_STORE_CONTAINER,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["python", "-m", C.RDZV_STORE_MODULE],
        "args": ["--port", str(port)],
        "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}],
        "ports": [{"name": C.RDZV_PORT_NAME, "containerPort": port, "protocol": "TCP"}],
        # The Service routes to Ready pods only: Ready once the store listens, not when
        # the container starts (importing torch takes seconds).
        "readinessProbe": {"tcpSocket": {"port": port}, "periodSeconds": 2},
        "resources": STORE_RESOURCES,
        # The store writes nothing: tested with `python -m ddpjob_trainer.rdzv_store` on a
        # read-only root (a client set and read a key; Python skips the bytecode cache it cannot
        # write). The trainer's containerSecurityContext is not applied: the store needs none of it.
        "securityContext": {**restricted_container(), "readOnlyRootFilesystem": True},
    }
    labels = {**store_labels(ref.name), **companion_queue_labels(spec)}  # in the job's Kueue quota
    return companion_pod(ref, rdzv_store_name(ref.name), labels, {
        # The operator replaces a failed store itself: a kubelet restart would bring the
        # port back empty while agents believe their rendezvous still exists.
        "restartPolicy": "Never",
        "containers": [container],
        **borrowed_scheduling(spec),
        # The trainer image runs it, so it runs as the node pods do (their uid and account).
        "securityContext": trainer_pod_security(spec),
        **service_account(spec),
    })

