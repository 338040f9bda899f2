"""Render a job's Kubernetes objects as plain dicts: one headless Service, one Pod per node.

Pure: no API calls. `kube.py` sends what this returns; tests compare it with
golden YAML files.
"""

from __future__ import annotations

from typing import Any, Sequence

from ddpjob_operator.api import constants as C
from ddpjob_operator.render.kueue import kueue_metadata
from ddpjob_operator.render.launch import NodeLaunch, forks_workers, launch_plan, working_dir
from ddpjob_operator.render.preflight import preflight_container
from ddpjob_operator.api.names import (
    c10d_host, managed_etcd_host, pod_hostname, pod_name, rdzv_store_host, service_name
)
from ddpjob_operator.api.job_ref import JobRef
from ddpjob_operator.api.spec import ETCD_BACKENDS, DDPJobSpec
from ddpjob_operator.api.quantity import GI, MI, format_bytes, parse_quantity
from ddpjob_operator.render.common import (
    common_labels, owner_reference, pod_labels, selector_labels, service_account, trainer_container_security,
    trainer_pod_security,
)

# /dev/shm is a tmpfs whose pages count against the pod's memory limit: unbounded, a DataLoader
# that fills it gets the pod OOM-killed with nothing pointing at shared memory. Bounded, the
# writer fails inside /dev/shm instead (DataLoader: "insufficient shared memory (shm)"), and
# the rest of the limit stays for the processes.
# Half the limit leaves both sides room; the floor (4x the container runtime's 64Mi default)
# keeps a few DataLoader workers going on small limits, never above the limit itself.
SHM_FLOOR = 256 * MI
# Without a memory limit the pod may use the node's memory anyway; 8Gi bounds a runaway while
# holding 8 DataLoader workers x prefetch 2 of ImageNet-sized batches (256 x 3 x 224 x 224 fp32,
# 154 MB each: 2.5 GB) with room for NCCL's shared-memory transport.
SHM_WITHOUT_LIMIT = 8 * GI


def render_service(ref: JobRef, spec: DDPJobSpec) -> dict[str, Any]:
    """The headless Service that gives every node pod a DNS name."""
    port = spec.elastic_policy.rdzv_port
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": service_name(ref.name),
            "namespace": ref.namespace,
            "labels": {**common_labels(ref.name), C.LABEL_COMPONENT: C.COMPONENT_RENDEZVOUS},
            "ownerReferences": [owner_reference(ref)],
        },
        "spec": {
            "clusterIP": "None",  # headless: DNS names resolve to pod IPs, no proxying
            # Agents must resolve node 0 while the pods start, before any is Ready.
            "publishNotReadyAddresses": True,
            "selector": selector_labels(ref.name),
            "ports": [{"name": C.RDZV_PORT_NAME, "port": port, "targetPort": port, "protocol": "TCP"}],
        },
    }


def node_launch(ref: JobRef, spec: DDPJobSpec, index: int, generation: int = 0) -> NodeLaunch:
    """The launch plan of node `index` of rendezvous generation `generation` inside the cluster."""
    store_pod = spec.elastic_policy.store_on_pod
    if spec.elastic_policy.managed_etcd.enabled:
        rdzv_host = managed_etcd_host(ref.name, ref.namespace)
    else:
        rdzv_host = rdzv_store_host(ref.name, ref.namespace) if store_pod else c10d_host(ref.name, ref.namespace)
    return launch_plan(
        job=ref.name, namespace=ref.namespace, uid=ref.uid, spec=spec, node_index=index,
        rdzv_host=rdzv_host,
        rdzv_generation=generation,
        snapshot_dir=spec.snapshot.mount_path if spec.snapshot else None,
        rdzv_credentials_dir=C.RDZV_SECRET_MOUNT_PATH if spec.elastic_policy.rdzv_secret_name else None,
    )


def render_pod(ref: JobRef, spec: DDPJobSpec, index: int, generation: int = 0,
               avoid: Sequence[str] = ()) -> dict[str, Any]:
    """Node pod `index` (same name after every replacement, so its DNS name is stable) of
    rendezvous generation `generation` (status.rendezvousGeneration), kept off the nodes
    `avoid` (status.avoidedNodes) by a required node anti-affinity."""
    po = spec.pod_overrides
    queue_labels, queue_annotations = kueue_metadata(ref, spec)
    annotations = {**po.annotations, **queue_annotations}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(ref.name, index),
            "namespace": ref.namespace,
            "labels": {**po.labels, **queue_labels, **pod_labels(ref.name, index, generation), **_etcd_client(spec)},
            **({"annotations": annotations} if annotations else {}),
            "ownerReferences": [owner_reference(ref)],
        },
        "spec": _pod_spec(ref, spec, index, generation, avoid),
    }


def _etcd_client(spec: DDPJobSpec) -> dict[str, str]:
    """The label the chart's shared etcd admits (C.LABEL_ETCD_CLIENT): only on the node pods of a job
    that dials an etcd of its own naming; a c10d job's pods, and a managed etcd's, never reach it."""
    ep = spec.elastic_policy
    return {C.LABEL_ETCD_CLIENT: "true"} if ep.rdzv_backend in ETCD_BACKENDS and not ep.managed_etcd.enabled else {}


def _pod_spec(ref: JobRef, spec: DDPJobSpec, index: int, generation: int = 0,
              avoid: Sequence[str] = ()) -> dict[str, Any]:
    container = _container(ref, spec, index, generation)
    body: dict[str, Any] = {
        # hostname + subdomain = the headless Service give <pod>.<job>.<ns>.svc DNS names.
        "hostname": pod_hostname(ref.name, index),
        "subdomain": service_name(ref.name),
        # The operator replaces failed pods itself (with backoff and a budget); torchrun
        # already restarts workers inside the pod (elasticPolicy.maxRestarts).
        "restartPolicy": "Never",
        # Service links would inject *_PORT variables; a Service named "master" sets
        # MASTER_PORT=tcp://... and breaks torch.distributed.
        "enableServiceLinks": False,
        "containers": [container],
        "volumes": _volumes(spec),
        "securityContext": trainer_pod_security(spec),
        **service_account(spec),
    }
    if spec.snapshot is not None:
        # Time to finish the step in flight and snapshot it after SIGTERM (trainer/stop.py).
        body["terminationGracePeriodSeconds"] = spec.snapshot.graceful_stop_seconds
    if spec.preflight.enabled:  # first: a bad node fails the pod before it joins the rendezvous
        # Without the fork server's directory: it is the trainer container's alone.
        mounts = [m for m in container["volumeMounts"] if m["name"] != C.ZYGOTE_VOLUME]
        body["initContainers"] = [preflight_container(spec, mounts, container["securityContext"])]
    return {**body, **_scheduling(ref, spec, avoid), **_pod_overrides(spec)}


def _container(ref: JobRef, spec: DDPJobSpec, index: int, generation: int = 0) -> dict[str, Any]:
    launch = node_launch(ref, spec, index, generation)
    container: dict[str, Any] = {
        "name": C.CONTAINER_NAME,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": launch.command,
        "args": launch.args,
        "env": _env(launch, spec, pod_name(ref.name, index)),
        # Relative saves land on the snapshot volume, shared by every node and replacement.
        **({"workingDir": work} if (work := working_dir(spec)) else {}),
        # The trainer keeps its last complete snapshot here (DDPJOB_TERMINATION_LOG); the kubelet
        # reports it when the container exits, so the operator learns progress and pods need no
        # API rights. Only an empty file falls back to the log tail.
        "terminationMessagePath": C.TERMINATION_LOG_PATH,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    # The trainer's progress endpoint, polled by the operator while the job runs.
    container["ports"] = [{"name": C.PROGRESS_PORT_NAME, "containerPort": C.PROGRESS_PORT, "protocol": "TCP"}]
    if spec.elastic_policy.store_on_node:
        port = spec.elastic_policy.rdzv_port
        container["ports"].insert(0, {"name": C.RDZV_PORT_NAME, "containerPort": port, "protocol": "TCP"})
    resources = {k: dict(v) for k, v in (("limits", spec.resources.limits),
                                         ("requests", spec.resources.requests)) if v}
    if resources:
        container["resources"] = resources
    container["volumeMounts"] = _volume_mounts(ref.name, spec)
    container["securityContext"] = trainer_container_security(spec)
    return container


def _env(launch: NodeLaunch, spec: DDPJobSpec, pod: str) -> list[dict[str, Any]]:
    """Operator variables, then spec.env; a user entry replaces the operator's of the same
    name (Kubernetes would let the later one win too, but warns about the duplicate)."""
    user = [e.model_dump(by_alias=True, exclude_none=True) for e in spec.env]
    overridden = {e["name"] for e in user}
    # Not in the launch plan: local runs have no kubelet, and their nodes share one address.
    pod_only = {C.ENV_TERMINATION_LOG: C.TERMINATION_LOG_PATH, C.ENV_PROGRESS_PORT: str(C.PROGRESS_PORT),
                # The progress record names its pod: the operator refuses one read from another pod.
                C.ENV_POD_NAME: pod,
                # The fast tier's copies on this pod's own memory volume, named rather than assumed
                # (the trainer's default is the same path): its sizeLimit is computed for them, and a
                # node that maps volumes to directories (the sandbox's) maps this with it, so the
                # copies end with the pod there too, as with a kubelet's per-pod emptyDir.
                C.ENV_FAST_SNAPSHOT_ROOT: C.SHM_MOUNT_PATH}
    ours = [{"name": k, "value": v} for k, v in {**launch.env, **pod_only}.items() if k not in overridden]
    return ours + user


def _volumes(spec: DDPJobSpec) -> list[dict[str, Any]]:
    volumes = []
    if spec.snapshot:
        volumes.append({"name": C.SNAPSHOT_VOLUME, **spec.snapshot.volume})
    # The container runtime's default /dev/shm is 64 MiB; DataLoader workers and NCCL
    # exchange tensors through it and die with "bus error" when it is full.
    volumes.append({"name": C.SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": shm_size_limit(spec)}})
    secret = spec.elastic_policy.rdzv_secret_name
    if secret:
        # The kubelet's default file mode (0644): the files belong to root and the trainer image
        # runs as a non-root user, so an owner-only mode would lock the agent out.
        volumes.append({"name": C.RDZV_SECRET_VOLUME, "secret": {"secretName": secret}})
    if forks_workers(spec):
        # The fork server's socket (DDPJOB_ZYGOTE_SOCKET): whoever reaches it runs code as the
        # trainer, so it lives where only the trainer container looks, not in the pod's shared
        # network namespace (an abstract name) where sidecars and debug containers could reach it.
        volumes.append({"name": C.ZYGOTE_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}})
    return volumes + [dict(v) for v in spec.pod_overrides.volumes]


def shm_size_limit(spec: DDPJobSpec) -> str:
    """sizeLimit of /dev/shm: spec.sharedMemorySize, else half the memory limit in whole MiB
    (at least SHM_FLOOR, at most the limit), else SHM_WITHOUT_LIMIT."""
    if spec.shared_memory_size:
        return spec.shared_memory_size
    limit = spec.resources.limits.get("memory")
    if limit is None:
        return format_bytes(SHM_WITHOUT_LIMIT)
    limit_bytes = int(parse_quantity(limit))
    half = limit_bytes // 2 // MI * MI
    return format_bytes(min(max(half, SHM_FLOOR), limit_bytes))


def snapshot_subpath(job: str) -> str:
    """The directory of the snapshot volume that job ``job``'s pods mount: its own, named after it."""
    return job


def _volume_mounts(job: str, spec: DDPJobSpec) -> list[dict[str, Any]]:
    mounts = []
    if spec.snapshot:
        # The job's own directory of the volume: jobs that share a claim (the examples' one claim, a
        # team's) never resume from, overwrite or prune each other's snapshots. Keyed by name, as the
        # working directory is: a job applied again under its name resumes from its files.
        mounts.append({"name": C.SNAPSHOT_VOLUME, "mountPath": spec.snapshot.mount_path,
                       "subPath": snapshot_subpath(job)})
    mounts.append({"name": C.SHM_VOLUME, "mountPath": C.SHM_MOUNT_PATH})
    if spec.elastic_policy.rdzv_secret_name:
        mounts.append({"name": C.RDZV_SECRET_VOLUME, "mountPath": C.RDZV_SECRET_MOUNT_PATH, "readOnly": True})
    if forks_workers(spec):
        mounts.append({"name": C.ZYGOTE_VOLUME, "mountPath": C.ZYGOTE_MOUNT_PATH})
    return mounts + [dict(m) for m in spec.pod_overrides.volume_mounts]


def _scheduling(ref: JobRef, spec: DDPJobSpec, avoid: Sequence[str] = ()) -> dict[str, Any]:
    s = spec.scheduling
    fields = {
        "nodeSelector": dict(s.node_selector),
        "tolerations": [dict(t) for t in s.tolerations],
        "affinity": avoiding_nodes(s.affinity, avoid),
        "topologySpreadConstraints": _spread_constraints(ref, spec),
        "priorityClassName": s.priority_class_name,
        "schedulerName": s.scheduler_name,
    }
    return {k: v for k, v in fields.items() if v}  # unset: leave the cluster's defaults


def _spread_constraints(ref: JobRef, spec: DDPJobSpec) -> list[dict[str, Any]]:
    """spec.scheduling.topologySpreadConstraints; one without labelSelector counts this job's
    node pods (without a selector the scheduler would count no pod at all)."""
    constraints = []
    for c in spec.scheduling.topology_spread_constraints:
        rendered = c.model_dump(by_alias=True, exclude_none=True, exclude_defaults=True)
        rendered.setdefault("labelSelector", {"matchLabels": selector_labels(ref.name)})
        constraints.append(rendered)
    return constraints


def avoiding_nodes(affinity: dict[str, Any], nodes: Sequence[str]) -> dict[str, Any]:
    """`affinity` (spec.scheduling.affinity) with a required anti-affinity to `nodes`.

    nodeSelectorTerms are ORed and the expressions inside one term ANDed, so the NotIn
    expression goes into every term the user gave (or into a term of its own): a pod may then
    land wherever the user allowed, except on an avoided node.
    """
    affinity = dict(affinity)
    if not nodes:
        return affinity
    avoid = {"key": C.LABEL_HOSTNAME, "operator": "NotIn", "values": sorted(nodes)}
    node_affinity = dict(affinity.get("nodeAffinity") or {})
    required = dict(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = [dict(t) for t in required.get("nodeSelectorTerms") or []] or [{}]
    for term in terms:
        term["matchExpressions"] = [*(term.get("matchExpressions") or []), avoid]
    required["nodeSelectorTerms"] = terms
    node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = required
    affinity["nodeAffinity"] = node_affinity
    return affinity


def _pod_overrides(spec: DDPJobSpec) -> dict[str, Any]:
    po = spec.pod_overrides
    fields = {"imagePullSecrets": [dict(s) for s in po.image_pull_secrets]}
    return {k: v for k, v in fields.items() if v}
