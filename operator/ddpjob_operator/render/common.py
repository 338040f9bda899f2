"""What every rendered object of a job shares (pure).

Labels and selectors, the owner reference that makes the job their controller (so
deleting the job deletes them), and the companion objects: the dedicated c10d store
(store_pod.py) and the managed etcd (etcd_pod.py) are each one small pod behind a
ClusterIP Service, owned by the job.
"""

from __future__ import annotations

from typing import Any

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.job_ref import JobRef
from ddpjob_operator.api.spec import DDPJobSpec


def common_labels(job: str) -> dict[str, str]:
    """Labels on every object of the job; LABEL_JOB_NAME is the selector."""
    return {
        C.LABEL_APP_NAME: C.APP_NAME,
        C.LABEL_INSTANCE: job,
        C.LABEL_MANAGED_BY: C.MANAGED_BY,
        C.LABEL_JOB_NAME: job,
    }


def selector_labels(job: str) -> dict[str, str]:
    """Labels that select the job's node pods (Service selector, scale selector); the
    component label keeps the rendezvous store pod out, so an HPA never counts it as a node."""
    return {C.LABEL_JOB_NAME: job, C.LABEL_COMPONENT: C.COMPONENT_NODE}


def selector(job: str) -> str:
    """status.selector: the label selector of the scale subresource, as a string."""
    return ",".join(f"{k}={v}" for k, v in selector_labels(job).items())


def job_selector(job: str) -> str:
    """Every pod the operator owns for the job (node pods and the rendezvous store pod):
    what a reconcile pass lists; plan and status tell the two apart by component."""
    return f"{C.LABEL_JOB_NAME}={job}"


def pod_labels(job: str, index: int, generation: int = 0) -> dict[str, str]:
    """Labels of node pod `index` of rendezvous generation `generation`."""
    return {**common_labels(job), C.LABEL_COMPONENT: C.COMPONENT_NODE, C.LABEL_NODE_INDEX: str(index),
            C.LABEL_RDZV_GENERATION: str(generation)}


def owner_reference(ref: JobRef) -> dict[str, Any]:
    """Makes the DDPJob the controller of an object, so deleting the job deletes it."""
    return {
        "apiVersion": C.API_VERSION,
        "kind": C.KIND,
        "name": ref.name,
        "uid": ref.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


# --- Companion objects: the store pod and the managed etcd ---------------------------------

def companion_metadata(ref: JobRef, name: str, labels: dict[str, str]) -> dict[str, Any]:
    """Metadata of a companion object: in the job's namespace, owned by the job."""
    return {"name": name, "namespace": ref.namespace, "labels": labels, "ownerReferences": [owner_reference(ref)]}


def companion_service(ref: JobRef, name: str, labels: dict[str, str], selector: dict[str, str],
                      port_name: str, port: int) -> dict[str, Any]:
    """A ClusterIP Service: its virtual IP and DNS name outlive every replaced pod, so clients
    started before a replacement reach the new one without a DNS cache going stale."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": companion_metadata(ref, name, labels),
        "spec": {"selector": selector,
                 "ports": [{"name": port_name, "port": port, "targetPort": port, "protocol": "TCP"}]},
    }


def companion_pod(ref: JobRef, name: str, labels: dict[str, str], pod_spec: dict[str, Any]) -> dict[str, Any]:
    """A companion pod with `pod_spec`; Service links are off (the job's Services are many)."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": companion_metadata(ref, name, labels),
            "spec": {"enableServiceLinks": False, **pod_spec}}


def borrowed_scheduling(spec: DDPJobSpec) -> dict[str, Any]:
    """The node pods' tolerations, priority class and pull secrets (the priority so a companion
    is not preempted before the nodes that depend on it). nodeSelector, affinity and
    schedulerName stay with the node pods: they usually ask for GPU nodes or a gang, which a
    small CPU-only companion must not wait for. Empty settings are left out."""
    s, po = spec.scheduling, spec.pod_overrides
    fields = {
        "tolerations": [dict(t) for t in s.tolerations],
        "priorityClassName": s.priority_class_name,
        "imagePullSecrets": [dict(x) for x in po.image_pull_secrets],
    }
    return {k: v for k, v in fields.items() if v}


# --- Pod security: every pod passes Pod Security "restricted" unless the spec says otherwise --
# https://kubernetes.io/docs/concepts/security/pod-security-standards/#restricted

# The container half of "restricted" (runAsNonRoot and seccomp sit at the pod level): no
# privilege gains through setuid or file-capability binaries, and an empty capability bounding
# set. A non-root process holds no effective capabilities anyway, so this costs nothing.
def restricted_container() -> dict[str, Any]:
    """The container securityContext fields "restricted" requires (a fresh dict each call)."""
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def restricted_pod_security() -> dict[str, Any]:
    """The pod half of "restricted", as the uid and gid of the ddpjob images (C.POD_UID)."""
    return {
        "runAsNonRoot": True,
        # Numeric, so the kubelet can check non-root even for an image whose USER is a name.
        "runAsUser": C.POD_UID,
        "runAsGroup": C.POD_GID,
        # The kubelet makes the pod's volumes (the snapshot claim among them) group-owned by this
        # gid and group-writable, so the non-root trainer can write to a freshly provisioned claim.
        "fsGroup": C.POD_GID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def trainer_pod_security(spec: DDPJobSpec) -> dict[str, Any]:
    """Pod securityContext of the pods that run spec.image (node pods, the store pod):
    restricted defaults, then each field set in spec.podOverrides.securityContext."""
    defaults = {
        **restricted_pod_security(),
        # Re-own a volume only while its root is not owned by fsGroup yet: the default (Always)
        # walks every file of the snapshot claim again each time a replaced pod mounts it.
        "fsGroupChangePolicy": "OnRootMismatch",
    }
    return {**defaults, **spec.pod_overrides.security_context.model_dump(by_alias=True, exclude_none=True)}


def trainer_container_security(spec: DDPJobSpec) -> dict[str, Any]:
    """securityContext of the trainer container: restricted, then each field set in
    spec.podOverrides.containerSecurityContext. The root filesystem stays writable:
    torchrun keeps its worker logs in a temporary directory under /tmp (tested: on a
    read-only root it exits with "No usable temporary directory found"), and training
    code writes caches under $HOME and /tmp."""
    user = spec.pod_overrides.container_security_context.model_dump(by_alias=True, exclude_none=True)
    return {**restricted_container(), **user}


def service_account(spec: DDPJobSpec) -> dict[str, Any]:
    """The account fields of a pod running spec.image. Training needs no API access (progress
    goes out through the termination message and an HTTP endpoint the operator polls), so
    without a serviceAccountName no token is mounted; with one, that account's own
    automountServiceAccountToken decides (the user chose it for a reason)."""
    name = spec.pod_overrides.service_account_name
    return {"serviceAccountName": name} if name else {"automountServiceAccountToken": False}
