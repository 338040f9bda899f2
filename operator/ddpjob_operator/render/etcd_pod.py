"""A job's own single-member etcd (`spec.elasticPolicy.managedEtcd.enabled`): its pod and Service (pure).

For jobs that want an etcd rendezvous (no node hosts the state, so losing any
node replaces only that node) without an etcd to share. The operator runs pod
and Service `<job>-etcd`, both owned by the job (garbage collection removes them
with it), and points every node's PET_RDZV_ENDPOINT at the Service.

The pod deliberately lacks the job-name label: node-pod listing, scaling and
status never see it. controller/observe.py observes it by its own selector
(`etcd_selector`) and passes what it saw to `plan_managed_etcd`, whose actions
(plan.py's CreatePod/CreateService/DeletePod) kube.py executes like any other.

Lifecycle: created with the job's first pass (the agents' etcd client retries
for rdzv_conf read_timeout, 60 s, while it starts); a pod that failed or was
evicted is deleted and created again (its emptyDir data, the rendezvous state,
is gone, which torch's agents survive by rendezvousing again); deleted when the
job finishes (it holds nothing worth keeping), the Service goes with the job.
"""

from __future__ import annotations

from typing import Any

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.names import managed_etcd_name
from ddpjob_operator.api.job_ref import JobRef
from ddpjob_operator.api.spec import DDPJobSpec
from ddpjob_operator.render.kueue import companion_queue_labels
from ddpjob_operator.render.common import (
    borrowed_scheduling, companion_pod, companion_service, restricted_container, restricted_pod_security,
)

PEER_PORT = 2380  # etcd's peer port; one member, so it only listens on loopback


RESOURCES = {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}}


def etcd_labels(job: str) -> dict[str, str]:
    """Labels of the etcd pod and Service: no job-name label, so node-pod selectors never match."""
    return {C.LABEL_APP_NAME: C.APP_NAME, C.LABEL_INSTANCE: job, C.LABEL_MANAGED_BY: C.MANAGED_BY,
            C.LABEL_COMPONENT: C.COMPONENT_ETCD}


def etcd_selector(job: str) -> str:
    """Label selector of the job's etcd pod (list and watch)."""
    return f"{C.LABEL_INSTANCE}={job},{C.LABEL_COMPONENT}={C.COMPONENT_ETCD}"


def render_etcd_service(ref: JobRef) -> dict[str, Any]:
    """The Service the agents reach etcd through: a replaced etcd pod gets a new IP, not a new name."""
    selector = {C.LABEL_INSTANCE: ref.name, C.LABEL_COMPONENT: C.COMPONENT_ETCD}
    return companion_service(ref, managed_etcd_name(ref.name), etcd_labels(ref.name), selector,
                             "client", C.DEFAULT_ETCD_PORT)


def render_etcd_pod(ref: JobRef, spec: DDPJobSpec) -> dict[str, Any]:
    """The etcd pod; shares the node pods' tolerations, priority and pull secrets, not their placement."""
    labels = {**etcd_labels(ref.name), **companion_queue_labels(spec)}  # in the job's Kueue quota
    return companion_pod(ref, managed_etcd_name(ref.name), labels, {
        # A crashed etcd restarts in place and keeps its emptyDir (the rendezvous state).
        "restartPolicy": "Always",
        "containers": [_container(ref, spec)],
        "volumes": [{"name": "data", "emptyDir": {}}],
        **borrowed_scheduling(spec),
        # The etcd image (distroless static) has no USER and would run as root. Its binary is
        # static and needs no account, and it writes only --data-dir: the emptyDir, which fsGroup
        # makes writable. C.POD_UID is distroless's own "nonroot" uid.
        "securityContext": restricted_pod_security(),
        # etcd never calls the Kubernetes API.
        "automountServiceAccountToken": False,
    })


def etcd_args(ref: JobRef, spec: DDPJobSpec) -> list[str]:
    """etcd's flags: one member named after the pod, clients on 2379, peers on loopback only."""
    name = managed_etcd_name(ref.name)
    peer = f"http://127.0.0.1:{PEER_PORT}"
    args = [
        f"--name={name}",
        "--data-dir=/var/lib/etcd",
        f"--listen-client-urls=http://0.0.0.0:{C.DEFAULT_ETCD_PORT}",
        f"--advertise-client-urls=http://{name}.{ref.namespace}.svc:{C.DEFAULT_ETCD_PORT}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster={name}={peer}",
    ]
    if spec.elastic_policy.rdzv_backend == "etcd":
        args.append("--enable-v2=true")  # torch's etcd backend speaks the v2 API only
    return args


def _container(ref: JobRef, spec: DDPJobSpec) -> dict[str, Any]:
    probe = {"httpGet": {"path": "/health", "port": C.DEFAULT_ETCD_PORT}}
    return {
        "name": C.ETCD_CONTAINER,
        "image": spec.elastic_policy.managed_etcd.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["etcd"],
        "args": etcd_args(ref, spec),
        "ports": [{"name": "client", "containerPort": C.DEFAULT_ETCD_PORT, "protocol": "TCP"}],
        "readinessProbe": {**probe, "periodSeconds": 2},
        "livenessProbe": {**probe, "initialDelaySeconds": 10, "periodSeconds": 20, "failureThreshold": 6},
        "resources": RESOURCES,
        # etcd writes only under --data-dir (a volume), so the image can be read-only.
        "securityContext": {**restricted_container(), "readOnlyRootFilesystem": True},
        "volumeMounts": [{"name": "data", "mountPath": "/var/lib/etcd"}],
    }
