"""Names of the objects and hosts the operator generates for a job.

One function per name, so the Service, the pods, the rendezvous endpoint and
the tests all agree; `name_too_long` is the one 63-character rule: validation
(validation.validate_job) and the CRD's CEL twin (crd.NAME_LENGTH_RULE) both use it.
"""

from __future__ import annotations

CLUSTER_DOMAIN = "cluster.local"  # default cluster DNS suffix of Service FQDNs
DNS_LABEL_MAX = 63  # RFC 1123 label limit for pod names, hostnames and Service names
NODE_POD_INFIX = "-node-"  # <job>-node-<index>: the longest name the operator generates


def service_name(job: str) -> str:
    """Headless Service of the job; also the pods' DNS subdomain."""
    return job


def pod_name(job: str, index: int) -> str:
    """Pod of node `index` (stable across replacements, so DNS names are stable)."""
    return f"{job}{NODE_POD_INFIX}{index}"


def pod_hostname(job: str, index: int) -> str:
    """spec.hostname of node `index`; equals the pod name so logs match DNS."""
    return pod_name(job, index)


def pod_fqdn(job: str, namespace: str, index: int, domain: str = CLUSTER_DOMAIN) -> str:
    """DNS name of node `index` through the headless Service."""
    return f"{pod_hostname(job, index)}.{service_name(job)}.{namespace}.svc.{domain}"


def c10d_host(job: str, namespace: str, domain: str = CLUSTER_DOMAIN) -> str:
    """Host of the c10d store with `rdzvStore: node`: node 0, which always exists while the job runs
    (scale-down removes the highest indexes and minReplicas is at least 1)."""
    return pod_fqdn(job, namespace, 0, domain)


def rdzv_endpoint(host: str, port: int) -> str:
    """`host:port` as torchrun's --rdzv-endpoint expects it."""
    return f"{host}:{port}"


def name_too_long(job: str, node_pods: int) -> str | None:
    """Why metadata.name `job` is too long for `node_pods` node pods, None when it fits.

    The longest generated name is node pod `node_pods - 1` (maxReplicas plus the spares, whose
    indexes continue the nodes'; the store and etcd names, `<job>-rdzv` and `<job>-etcd`, are
    shorter); it must fit a DNS label.
    """
    longest = pod_name(job, max(node_pods - 1, 0))
    if len(longest) <= DNS_LABEL_MAX:
        return None
    allowed = DNS_LABEL_MAX - (len(longest) - len(job))
    return (f"is too long: pod name {longest!r} has {len(longest)} characters, over the "
            f"DNS label limit of {DNS_LABEL_MAX}; use at most {allowed} characters")


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


def network_policy_name(job: str) -> str:
    """The job's NetworkPolicy: the job's own name (a kind of its own, so it clashes with nothing)."""
    return job


def disruption_budget_name(job: str) -> str:
    """The job's PodDisruptionBudget: the job's own name (a kind of its own, so it clashes with nothing)."""
    return job
