"""What a job's companion objects share: the dedicated c10d store (rdzv_store.py) and the
managed etcd (managed_etcd.py) are each one small pod behind a ClusterIP Service, owned by
the job so garbage collection removes them with it. Pure."""

from __future__ import annotations

from typing import Any

from .render import owner_reference
from .spec import DDPJobSpec, JobRef


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
