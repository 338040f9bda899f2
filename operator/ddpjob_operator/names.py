"""Names of the objects and hosts the operator generates for a job.

One function per name, so the Service, the pods, the rendezvous endpoint and
the tests all agree; `check_name_lengths` rejects a job whose longest generated
name would break the 63-character DNS label limit before anything is created.
"""

from __future__ import annotations

from .constants import CLUSTER_DOMAIN, DNS_LABEL_MAX


class NameTooLongError(ValueError):
    """A generated name would exceed the DNS label limit."""


def service_name(job: str) -> str:
    """Headless Service of the job; also the pods' DNS subdomain."""
    return job


def pod_name(job: str, index: int) -> str:
    """Pod of node `index` (stable across replacements, so DNS names are stable)."""
    return f"{job}-node-{index}"


def pod_hostname(job: str, index: int) -> str:
    """spec.hostname of node `index`; equals the pod name so logs match DNS."""
    return pod_name(job, index)


def pod_fqdn(job: str, namespace: str, index: int, domain: str = CLUSTER_DOMAIN) -> str:
    """DNS name of node `index` through the headless Service."""
    return f"{pod_hostname(job, index)}.{service_name(job)}.{namespace}.svc.{domain}"


def c10d_host(job: str, namespace: str, domain: str = CLUSTER_DOMAIN) -> str:
    """Host of the c10d rendezvous store: node 0, which always exists while the job runs
    (scale-down removes the highest indexes and minReplicas is at least 1)."""
    return pod_fqdn(job, namespace, 0, domain)


def rdzv_endpoint(host: str, port: int) -> str:
    """`host:port` as torchrun's --rdzv-endpoint expects it."""
    return f"{host}:{port}"


def check_name_lengths(job: str, max_replicas: int) -> None:
    """Raise NameTooLongError when the longest generated DNS label is over 63 characters.

    Args:
        job: metadata.name of the DDPJob.
        max_replicas: spec.elasticPolicy.maxReplicas; the highest index is max_replicas - 1.

    Raises:
        NameTooLongError: naming metadata.name, the longest name and the limit.
    """
    longest = pod_name(job, max(max_replicas - 1, 0))
    if len(longest) > DNS_LABEL_MAX:
        allowed = DNS_LABEL_MAX - (len(longest) - len(job))
        raise NameTooLongError(
            f"metadata.name ({job!r}, {len(job)} characters) is too long: pod name {longest!r} "
            f"has {len(longest)} characters, over the DNS label limit of {DNS_LABEL_MAX}; "
            f"use at most {allowed} characters for this maxReplicas"
        )


def rdzv_store_name(job: str) -> str:
    """Pod and Service of the dedicated c10d store (elasticPolicy.rdzvStore: pod)."""
    return f"{job}-rdzv"


def rdzv_store_host(job: str, namespace: str, domain: str = CLUSTER_DOMAIN) -> str:
    """DNS name of the store's Service: stable across store pod replacements."""
    return f"{rdzv_store_name(job)}.{namespace}.svc.{domain}"


def managed_etcd_name(job: str) -> str:
    """Pod and Service of the job's managed etcd (elasticPolicy.managedEtcd.enabled)."""
    return f"{job}-etcd"


def managed_etcd_host(job: str, namespace: str, domain: str = CLUSTER_DOMAIN) -> str:
    """DNS name of the managed etcd's Service."""
    return f"{managed_etcd_name(job)}.{namespace}.svc.{domain}"
