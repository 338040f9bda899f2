"""The dedicated c10d rendezvous store: one small pod and a Service in front of it.

With c10d (unless `spec.elasticPolicy.rdzvStore: node`) no training node hosts torch's c10d TCPStore;
a pod `<job>-rdzv` runs the store in the job's own image (so it speaks exactly the torch version
of the agents) and every agent joins as a client (`is_host=false` in PET_RDZV_CONF).

The store is `python -c <program>`, the text of ddpjob_rdzv/store_program.py (standard library
and torch only): the image needs Python and torch, not ddpjob-trainer, so a plain PyTorch image
runs a c10d job on the default topology. Inline rather than a ConfigMap (another object per job,
RBAC on ConfigMaps, a volume) or an image of ours (a second image to mirror and keep at the
agents' torch version); it is about 3.6 KB, bounded by STORE_PROGRAM_MAX_BYTES.

Losing any training node then replaces only that node; losing the store loses the rendezvous
state, which topology.py turns into a whole-group restart under a new rendezvous id.

Pure: the pod and Service come back as dicts for kube.py to create.
"""

from __future__ import annotations

from importlib.resources import files
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

# The store pod's program (see the module docstring), read once from the installed ddpjob-rdzv.
STORE_PROGRAM = (files("ddpjob_rdzv") / "store_program.py").read_text(encoding="utf-8")
# Every store pod carries the program: a bound on what one pod spec (and `kubectl describe`) holds.
STORE_PROGRAM_MAX_BYTES = 4096

# Enough for a TCPStore holding a few hundred rendezvous keys; torch's import dominates.
STORE_RESOURCES = {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}}


def store_labels(job: str) -> dict[str, str]:
    """Labels of the store pod and Service; the job-name label lets the operator's pod
    watch and list see the store, the component label tells it apart from node pods."""
    return {**common_labels(job), C.LABEL_COMPONENT: C.COMPONENT_RDZV_STORE}


def store_command(python: str = "python") -> list[str]:
    """The store's command: `python` (the image's) running STORE_PROGRAM; arguments follow.
    `ddpjob run` passes the nodes' interpreter, so a run starts what a pod starts."""
    return [python, "-c", STORE_PROGRAM]


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
        "command": store_command(),
        "args": ["--port", str(port)],
        "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}],
        "ports": [{"name": C.RDZV_PORT_NAME, "containerPort": port, "protocol": "TCP"}],
        # The Service routes to Ready pods only: Ready once the store listens, not when
        # the container starts (importing torch takes seconds).
        "readinessProbe": {"tcpSocket": {"port": port}, "periodSeconds": 2},
        "resources": STORE_RESOURCES,
        # The store writes nothing: `python -c` compiles in memory, and the same store code (as
        # `python -m ddpjob_trainer.rdzv_store`) was tested on a read-only root (a client set and
        # read a key). The trainer's containerSecurityContext is not applied: the store needs none of it.
        "securityContext": {**restricted_container(), "readOnlyRootFilesystem": True},
    }
    labels = {**store_labels(ref.name), **companion_queue_labels(spec)}  # in the job's Kueue quota
    return companion_pod(ref, rdzv_store_name(ref.name), labels, {
        # The operator replaces a failed store itself: a kubelet restart would bring the
        # port back empty while agents believe their rendezvous still exists.
        "restartPolicy": "Never",
        "containers": [container],
        **borrowed_scheduling(spec),
        # The job's image runs it, so it runs as the node pods do (their uid and account).
        "securityContext": trainer_pod_security(spec),
        **service_account(spec),
    })

