"""The DDPJob spec model: field types, descriptions, defaults and CEL rules.

This module is the single source of truth for the API's shape. `crd.py` turns these models
into the CRD's openAPIV3Schema (descriptions, enums, minimums, defaults and the CEL rules
attached here with `cel(...)`), and the README field reference is generated from them. The
status model is `status.py`. Every cross-field CEL rule has a Python twin in `validation.py`,
which is also where user input is read (`parse_spec`, `parse_job`): a rule the API server could
not run (old cluster, `kubectl apply --validate=false`, local runs) is still enforced, reported
as InvalidSpec. `DDPJobSpec.model_validate` alone checks each field and resolves the defaults
below, not the cross-field rules: read user input through validation.py.

Defaults that depend on other fields (they cannot live in the CRD schema):
  * `elasticPolicy.minReplicas` defaults to `replicas` (1 when neither is set);
  * `elasticPolicy.maxReplicas` defaults to max(`minReplicas`, `replicas`);
  * `replicas` defaults to `minReplicas`: a job starts with the nodes it needs
    and grows through the scale subresource (kubectl scale, an autoscaler).
So `replicas: 3` alone is a fixed-size 3-node job, and `elasticPolicy: {minReplicas: 2,
maxReplicas: 8}` alone starts 2 nodes and may be scaled to 8.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    StringConstraints,
    WithJsonSchema,
    model_validator,
)

from ddpjob_rdzv import BACKEND_NAME as ETCD_V3  # ddpjob's torchrun backend; defined where both sides read it
from ddpjob_rdzv.contract import MAX_REPLACEMENT_WAIT_SECONDS

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.base import ApiModel, KubeObject

GPU_RESOURCE = "nvidia.com/gpu"  # extended resource that nProcPerNode "gpu" needs
ETCD_BACKENDS = ("etcd", ETCD_V3)  # backends that talk to an external etcd

# Environment variables the operator sets from a spec field; a user entry for one of them
# would silently fight the field (or break the rendezvous), so validation rejects it and
# names the field to use instead. Other operator variables (PYTHONUNBUFFERED, ...) may be
# overridden by spec.env: user entries come last and win.
RESERVED_ENV = {
    "PET_NNODES": "spec.elasticPolicy.minReplicas/maxReplicas",
    "PET_NPROC_PER_NODE": "spec.elasticPolicy.nProcPerNode",
    "PET_RDZV_BACKEND": "spec.elasticPolicy.rdzvBackend",
    "PET_RDZV_ENDPOINT": "spec.elasticPolicy.rdzvEndpoints/rdzvPort",
    "PET_RDZV_ID": "metadata.uid and status.rendezvousGeneration (set by the operator)",
    "PET_RDZV_CONF": "spec.elasticPolicy.rdzvTimeouts",
    "PET_MAX_RESTARTS": "spec.elasticPolicy.maxRestarts",
    "PET_SHUTDOWN_TIMEOUT": "spec.snapshot.gracefulStopSeconds",
    C.ENV_SNAPSHOT_DIR: "spec.snapshot.mountPath",
    C.ENV_SNAPSHOT_ON_UNREADABLE: "spec.snapshot.onUnreadable",
    C.ENV_JOB_NAME: "metadata.name (set by the operator)",
    C.ENV_NODE_INDEX: "the pod's node index (set by the operator)",
    C.ENV_NAMESPACE: "metadata.namespace (set by the operator)",
    C.ENV_ZYGOTE_SOCKET: "spec.elasticPolicy.fastRestart",
    C.ENV_ZYGOTE_TOKEN: "spec.elasticPolicy.fastRestart (each node's agent makes its own token)",
    C.ENV_COLLECTIVE_TIMEOUT: "spec.failurePolicy.collectiveTimeoutSeconds",
}
RESERVED_LABELS = (C.LABEL_JOB_NAME, C.LABEL_NODE_INDEX, C.LABEL_APP_NAME, C.LABEL_INSTANCE,
                   C.LABEL_COMPONENT, C.LABEL_MANAGED_BY, C.LABEL_ETCD_CLIENT)  # selectors depend on these
RESERVED_VOLUMES = (C.SNAPSHOT_VOLUME, C.SHM_VOLUME, C.RDZV_SECRET_VOLUME, C.ZYGOTE_VOLUME)  # pod volume names the operator uses
# Kueue admits pods by these (the operator sets them from spec.scheduling.queueName): copied into
# podOverrides, they would put the job's pods into another job's pod group or Workload, against its quota.
RESERVED_KUEUE_LABELS = (C.LABEL_KUEUE_QUEUE, C.LABEL_KUEUE_POD_GROUP, "kueue.x-k8s.io/prebuilt-workload-name")
RESERVED_KUEUE_ANNOTATIONS = (C.ANNOTATION_KUEUE_GROUP_COUNT,)
# Capabilities a job may add: Pod Security "baseline"'s list, plus IPC_LOCK, which lifts only the
# locked-memory limit that RDMA (NCCL over InfiniBand) pins its buffers under. Anything else
# (SYS_ADMIN, NET_ADMIN, SYS_PTRACE, ...) reaches past the container; a namespace that wants it
# runs the pods itself. Only a root process gets added capabilities anyway (no ambient set).
SAFE_CAPABILITIES = ("AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "IPC_LOCK", "KILL", "MKNOD",
                     "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT")
PRIVILEGED_RULE = "may not be true: a privileged container holds every device and capability of its node"
ESCALATION_RULE = "may not be true: setuid and file-capability binaries would regain what the container dropped"
HOST_PATH_RULE = ("may not be set: a hostPath volume reaches the node's own files; use a PersistentVolumeClaim, "
                  "an emptyDir or another volume type")
MAX_CAPABILITIES = 32  # capabilities.add entries (Linux has ~41): bounds the CEL rule's cost
MAX_CAPABILITY_NAME = 64  # characters of one capability name
SECRET_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"  # a Secret's name: an RFC 1123 DNS subdomain
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"  # a label value, as apimachinery checks it
# metadata.name is also the headless Service's name, which Kubernetes checks as a DNS-1035 label
# (it must start with a letter), and the prefix of the pods' hostnames (no dots): stricter than
# the DNS-1123 subdomain the API server checks for every object name.
JOB_NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
JOB_NAME_RULE = ("must be a DNS-1035 label: lowercase letters, digits and hyphens, starting with a letter "
                 "and ending with a letter or digit (it names the Service and the pods of the job)")
VOLUME_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"  # a pod volume name: a DNS-1123 label
# A container env var name as apimachinery's IsEnvVarName checks it (Kubernetes 1.34 relaxed the
# rule to any printable ASCII but '=', behind a feature gate older clusters lack).
ENV_NAME_PATTERN = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
# What `torchrun -m` can import: dotted Python identifiers (a path such as train.py belongs in script).
MODULE_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"
IMAGE_PATTERN = r"^\S+$"  # an image reference has no whitespace (the kubelet cannot pull " img")

# Kubernetes resource.Quantity as apimachinery's OpenAPI pattern spells it, without the leading
# '-': no resource of a container may be negative (the API server refuses it at pod creation).
QUANTITY_PATTERN = (
    r"^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
    r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
# The longest quantity string the CRD accepts. Without a bound, kube-apiserver's CEL cost
# estimator prices the non-negative rule below for a string as long as a whole request and
# refuses the CRD at install ("estimated rule cost exceeds budget by factor of 1.006650x",
# kube-apiserver v1.37.2, tests/cluster/test_crd_on_apiserver.py). 64 characters hold any
# real quantity ("123456789012345678901234567890Mi" is 32).
QUANTITY_MAX_LENGTH = 64
# Size limits. Each list or string a CEL rule walks has a maximum, so the API server's cost
# estimate (it assumes the largest input the schema allows) stays within its per-rule budget.
MAX_REPLICAS = 1000  # most nodes a job may ask for (replicas, minReplicas, maxReplicas); see DDPJobSpec
# Most spare node pods: a few cover the node losses one incident window sees; each is a whole node
# pod held idle against quota, so a larger number is a typo rather than a plan.
MAX_SPARE_REPLICAS = 16
# elasticPolicy.replacementWaitSeconds by default (docs/recovery.md "One pause without spares":
# chosen by `python -m bench goodput`'s wait columns).
DEFAULT_REPLACEMENT_WAIT_SECONDS = 0
MAX_ENV = 128  # most spec.env entries
MAX_RESOURCES = 32  # most resource names in limits or requests (each runs the quantity rule)
MAX_VOLUMES = 64  # most spec.podOverrides.volumes
MAX_VOLUME_MOUNTS = 64  # most spec.podOverrides.volumeMounts
MAX_PATH = 4096  # longest mountPath: Linux's PATH_MAX
MAX_IMAGE = 1024  # longest image: a reference is at most 255 (name) + 129 (tag) + 136 (sha512 digest)
MAX_NAME = 253  # longest env var, module or script name we accept (a DNS subdomain's length)
MAX_RDZV_ENDPOINTS = 16  # most etcd endpoints: a cluster of 3 to 7 members, with room to spare
MAX_ENDPOINT = 261  # longest host:port: a DNS name (253) + ':' + a port (5) + IPv6 brackets (2)


def cel(rule: str, message: str, message_expression: str | None = None) -> dict[str, str]:
    """One CEL `x-kubernetes-validations` entry (rule, message and optional messageExpression).

    A messageExpression must stay cheap by the API server's own estimate: concatenating strings
    whose schema bounds their length is fine, but `string(<int>)` has no bound the estimator can
    see, and kube-apiserver refuses the whole CRD at install for one such expression (proved by
    tests/cluster/test_crd_on_apiserver.py against a real kube-apiserver). A message that names an
    integer spells it with `cel_int_text`.
    """
    entry = {"rule": rule, "message": message}
    if message_expression:
        entry["messageExpression"] = message_expression
    return entry


_CEL_DIGITS = "['0', '1', '2', '3', '4', '5', '6', '7', '8', '9']"


def cel_int_text(value: str, largest: int = MAX_REPLICAS) -> str:
    """CEL spelling the integer `value` (0 <= value <= `largest`, as its schema bounds it) in decimal.

    Built from one-character strings picked out of a list literal: kube-apiserver v1.37.2 prices
    that at a few units, where `string(value)` or `'%d'.format([value])` get the CRD refused at
    install (tests/cluster/test_crd_on_apiserver.py). The schema's maximum bounds the digits.
    """
    places = [10 ** p for p in range(len(str(largest)) - 1, -1, -1)]
    return " + ".join(f"({value} >= {place} ? {_CEL_DIGITS}[({value} / {place}) % 10] : '')" if place > 1
                      else f"{_CEL_DIGITS}[{value} % 10]" for place in places)


def immutable(path: str, why: str) -> dict[str, Any]:
    """json_schema_extra for a field that may not change once set (a CEL transition rule)."""
    return {"x-kubernetes-validations": [cel("self == oldSelf", f"{path} is immutable: {why}")]}


# --- Field types that are not plain JSON types ------------------------------

def _check_nproc(value: Any) -> int | str:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    if value in ("gpu", "auto"):
        return value
    raise ValueError('must be an integer >= 1, "gpu" or "auto"')


NProcPerNode = Annotated[
    int | str,
    PlainValidator(_check_nproc),
    WithJsonSchema({
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        "x-kubernetes-int-or-string": True,
        "x-kubernetes-validations": [cel(
            "type(self) == int ? self >= 1 : self in ['gpu', 'auto']",
            'spec.elasticPolicy.nProcPerNode must be an integer >= 1, "gpu" or "auto"',
        )],
    }),
]


def _check_quantity(value: Any) -> int | str:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str) and len(value) <= QUANTITY_MAX_LENGTH and re.match(QUANTITY_PATTERN, value):
        return value
    raise ValueError('must be a non-negative Kubernetes quantity such as 2, "500m" or "16Gi" (quote fractions)')


Quantity = Annotated[
    int | str,
    PlainValidator(_check_quantity),
    WithJsonSchema({
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        "x-kubernetes-int-or-string": True,
        "pattern": QUANTITY_PATTERN,  # strings only: JSON Schema patterns skip integers
        "maxLength": QUANTITY_MAX_LENGTH,  # strings only, like the pattern
        "x-kubernetes-validations": [cel(
            "type(self) == int ? self >= 0 : true",
            "spec.resources quantities must not be negative",
        )],
    }),
]

# A label value (podOverrides.labels, scheduling.nodeSelector); the API server checks it only
# when the pod is created, so the CRD checks it here. Keys are checked by the operator
# (validation.qualified_name_problem): a CEL rule over a map's keys has no length bound to estimate with.
LabelValue = Annotated[str, Field(max_length=63, pattern=LABEL_VALUE_PATTERN)]

# The clean absolute path the kubelet will mount at: no '.', '..' or empty segment and no
# trailing '/' (so two spellings of one directory cannot slip past the "already mounted"
# rules, which compare strings). Segment = anything but '.' and '..', spelt without lookahead
# because the API server's regex engine (RE2) has none.
MOUNT_PATH_PATTERN = r"^(/([^/.][^/]*|[.][^/.][^/]*|[.][.][^/]+))+$"
MountPath = Annotated[str, Field(max_length=MAX_PATH, pattern=MOUNT_PATH_PATTERN)]

# podOverrides.volumes[] and volumeMounts[] are core/v1 objects passed through, but the CEL
# rules about the operator's own volumes read their name and mountPath, and CEL sees only
# declared fields: so those are declared (and bounded), the rest is kept as given.
VOLUME_SCHEMA = {
    "type": "object", "x-kubernetes-preserve-unknown-fields": True, "required": ["name"],
    "properties": {"name": {"type": "string", "description": "Volume name (a DNS-1123 label).",
                            "maxLength": 63, "pattern": VOLUME_NAME_PATTERN},
                   # Declared only so that the rule below can see it (CEL sees declared fields only).
                   "hostPath": {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                                "description": "Refused: a job's pods may not mount the node's files."}},
    "x-kubernetes-validations": [{"rule": "!has(self.hostPath)",
                                  "message": f"spec.podOverrides.volumes[].hostPath {HOST_PATH_RULE}"}],
}
MOUNT_SCHEMA = {
    "type": "object", "x-kubernetes-preserve-unknown-fields": True, "required": ["name", "mountPath"],
    "properties": {
        "name": {"type": "string", "description": "Name of the volume to mount.",
                 "maxLength": 63, "pattern": VOLUME_NAME_PATTERN},
        "mountPath": {"type": "string", "description": "Where the volume appears in the container.",
                      "maxLength": MAX_PATH, "pattern": MOUNT_PATH_PATTERN},
    },
}


def list_map(*keys: str) -> dict[str, Any]:
    """json_schema_extra of a list whose entries are unique by `keys`: the API server rejects a
    duplicate at `kubectl apply` (and server-side apply merges entries by these keys)."""
    return {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": list(keys)}


def _object(model: type[BaseModel], description: str, **extra: Any) -> Any:
    """An optional nested object that defaults to all of its own defaults.

    The CRD gets `default: {}` so the API server fills the nested defaults in too.
    """
    return Field(default_factory=model, description=description,
                 json_schema_extra={"default": {}, **extra})


# --- The spec ----------------------------------------------------------------

class EnvVar(ApiModel):
    """A core/v1 EnvVar: a literal value or a reference (valueFrom)."""

    name: str = Field(min_length=1, max_length=MAX_NAME, pattern=ENV_NAME_PATTERN, description="Variable name.")
    value: str | None = Field(None, description="Literal value.")
    value_from: KubeObject | None = Field(
        None, description="core/v1 EnvVarSource (secretKeyRef, configMapKeyRef, fieldRef, ...).")


class Resources(ApiModel):
    """Compute resources of the trainer container (core/v1 ResourceRequirements)."""

    limits: dict[str, Quantity] = Field(
        default_factory=dict, max_length=MAX_RESOURCES,
        description="Maximum resources, e.g. {cpu: \"4\", memory: 16Gi, nvidia.com/gpu: 1}.")
    requests: dict[str, Quantity] = Field(
        default_factory=dict, max_length=MAX_RESOURCES,
        description="Guaranteed resources (each <= its limit); default to the limits.")


class RdzvTimeouts(ApiModel):
    """torchrun rendezvous timeouts (PET_RDZV_CONF); lower values notice failures sooner."""

    join_seconds: int = Field(600, ge=1, description=(
        "How long an agent waits for a rendezvous to complete (join_timeout)."))
    last_call_seconds: int = Field(30, ge=0, description=(
        "Wait for more nodes after minReplicas joined (last_call_timeout); "
        "every restart pays it."))
    close_seconds: int = Field(30, ge=1, description=(
        "Wait for the rendezvous to close after maxReplicas joined (close_timeout)."))
    keep_alive_interval_seconds: int = Field(5, ge=1, description=(
        "Heartbeat period of each agent (keep_alive_interval)."))
    keep_alive_max_attempts: int = Field(3, ge=1, description=(
        "Missed heartbeats before a node counts as dead (keep_alive_max_attempt)."))


class ManagedEtcd(ApiModel):
    """A single-member etcd the operator runs for this job alone (etcd backends only)."""

    enabled: bool = Field(False, description=(
        "Run a one-member etcd (pod and Service <job>-etcd, owned by the job) and point the nodes "
        "at it; rdzvEndpoints must then be empty. Plaintext, no auth, data on an emptyDir: for "
        "jobs that want etcd's rendezvous without an etcd to share; the job's NetworkPolicy "
        "(spec.networkPolicy) admits only the job's node pods. Deleted when the job finishes."))
    image: str = Field(C.MANAGED_ETCD_IMAGE, min_length=1, description=(
        "etcd image; 3.5 still serves the v2 API that rdzvBackend etcd needs."))


class ElasticPolicy(ApiModel):
    """How torchrun forms and re-forms the training group (Kubeflow's names)."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        cel("!has(self.minReplicas) || !has(self.maxReplicas) || self.maxReplicas >= self.minReplicas",
            "spec.elasticPolicy.maxReplicas must be >= spec.elasticPolicy.minReplicas",
            f"'spec.elasticPolicy.maxReplicas (' + {cel_int_text('self.maxReplicas')} + ') must be >= "
            f"spec.elasticPolicy.minReplicas (' + {cel_int_text('self.minReplicas')} + ')'"),
        cel("!has(self.rdzvBackend) || self.rdzvBackend == 'c10d' || "
            "(has(self.rdzvEndpoints) && size(self.rdzvEndpoints) > 0) || "
            "(has(self.managedEtcd) && has(self.managedEtcd.enabled) && self.managedEtcd.enabled)",
            "spec.elasticPolicy.rdzvEndpoints must list at least one etcd host:port "
            "when rdzvBackend is etcd or etcd-v3 (or set managedEtcd.enabled: true)"),
        cel("!has(self.managedEtcd) || !has(self.managedEtcd.enabled) || !self.managedEtcd.enabled || "
            "(has(self.rdzvBackend) && self.rdzvBackend != 'c10d' && "
            "(!has(self.rdzvEndpoints) || size(self.rdzvEndpoints) == 0) && !has(self.rdzvSecretName))",
            "spec.elasticPolicy.managedEtcd.enabled needs rdzvBackend etcd or etcd-v3, no "
            "rdzvEndpoints and no rdzvSecretName (the operator points the nodes at its own "
            "plaintext etcd)"),
        cel("(has(self.rdzvBackend) && self.rdzvBackend != 'c10d') || "
            "!has(self.rdzvEndpoints) || size(self.rdzvEndpoints) == 0",
            "spec.elasticPolicy.rdzvEndpoints must be empty when rdzvBackend is c10d "
            "(the operator points every node at the job's c10d store: its <job>-rdzv pod, or node 0 with rdzvStore: node)"),
        cel("!has(self.rdzvSecretName) || (has(self.rdzvBackend) && self.rdzvBackend != 'c10d')",
            "spec.elasticPolicy.rdzvSecretName may only be set when rdzvBackend is etcd or etcd-v3 "
            "(c10d has no etcd to authenticate to): remove it or change rdzvBackend"),
        cel("!has(self.rdzvStore) || self.rdzvStore == 'node' || "
            "!has(self.rdzvBackend) || self.rdzvBackend == 'c10d'",
            "spec.elasticPolicy.rdzvStore may be pod only when rdzvBackend is c10d "
            "(etcd backends keep their state in etcd): remove it or set rdzvBackend to c10d"),
        # On the effective value: a field-level `self == oldSelf` only runs when both objects set
        # rdzvStore, so adding `rdzvStore: node` to a job that ran with the (unset) pod default
        # would pass and split the group between two stores.
        cel("(has(self.rdzvStore) ? self.rdzvStore : 'pod') == "
            "(has(oldSelf.rdzvStore) ? oldSelf.rdzvStore : 'pod')",
            "spec.elasticPolicy.rdzvStore is immutable: nodes of one job must share one rendezvous "
            "(unset means pod)"),
        cel("!has(self.rdzvBackend) || self.rdzvBackend != 'etcd' || "
            "!has(self.rdzvEndpoints) || size(self.rdzvEndpoints) <= 1",
            "spec.elasticPolicy.rdzvEndpoints must have exactly one entry when rdzvBackend "
            "is etcd (torch's v2 backend takes one endpoint; etcd-v3 takes several)"),
    ]})

    # Immutable, defaults included: a rule on the spec (_size_rule) compares the resolved range.
    min_replicas: int | None = Field(None, ge=1, le=MAX_REPLICAS, description=(
        "Fewest nodes that may train (torchrun --nnodes MIN:MAX). Default: replicas, or 1. "
        "Fixed when the job is created, the default included."))
    max_replicas: int | None = Field(None, ge=1, le=MAX_REPLICAS, description=(
        "Most nodes that may train; replicas may be scaled up to it. "
        "Default: max(minReplicas, replicas), so a job that sets neither has a fixed size. "
        "Fixed when the job is created, the default included."))
    n_proc_per_node: NProcPerNode = Field("auto", description=(
        'Worker processes per node (torchrun --nproc-per-node): an integer, "gpu" (torchrun counts '
        'the GPUs the container sees; needs an nvidia.com/gpu limit) or "auto", which the operator '
        'resolves to a number: resources.limits["nvidia.com/gpu"] when set, else the whole CPUs of '
        'the CPU request (resources.requests.cpu, else resources.limits.cpu; rounded down, at least 1: '
        '"2" -> 2, "1500m" -> 1), else 1. This default differs from torchrun\'s own "auto" '
        '(the one a Kubeflow PyTorchJob user may know), which without an accelerator starts one '
        'worker per CPU the process may run on: every CPU of the node (a CPU limit does not '
        'change it) unless the kubelet\'s static CPU manager pins a Guaranteed pod to its CPUs. '
        'A request set by a LimitRange is not seen (it is added at admission, after the operator '
        'rendered the pod).'))
    spare_replicas: int = Field(0, ge=0, le=MAX_SPARE_REPLICAS, description=(
        "Warm spare node pods beyond replicas: each starts like any node (torchrun agent up, torch "
        "imported) but waits outside the training group, in the rendezvous' redundancy list, until a "
        "node is lost; then it joins at once (no backoff, no cold start, one pause for the survivors) "
        "and the operator creates a new spare. Spares are ordinary pods named <job>-node-<index> "
        "after the replicas: they count against quota (and Kueue's pod group) like any node. A spare "
        "waits only while the group is full, so a value above 0 needs spec.replicas equal to "
        "maxReplicas (a fixed-size job)."))
    replacement_wait_seconds: int = Field(
        DEFAULT_REPLACEMENT_WAIT_SECONDS, ge=0, le=MAX_REPLACEMENT_WAIT_SECONDS, description=(
            "After a node is lost without a word (its agent killed, its machine gone), how long the "
            "surviving nodes wait for its replacement before they re-form the group at reduced size. "
            "0: re-form at once and restart again when the replacement joins (two pauses, training "
            "at reduced size between them); above 0: the round waits up to this long for the size "
            "it had before the loss and completes the moment the replacement joins (one pause), "
            "smaller only after the wait. Worth it where the replacement comes sooner than the second "
            "pause and the reduced-size stretch cost (docs/recovery.md, measured). Honoured by "
            "ddpjob's rendezvous (fastRestart, or rdzvBackend etcd-v3); torch's own ignores it. "
            "A node that leaves on purpose (graceful stop, scale-down) is not waited for. "
            "Rendered as rdzv_conf replacement_wait."))
    max_restarts: int = Field(3, ge=0, description=(
        "Worker group restarts torchrun does inside a pod before the pod fails "
        "(torchrun --max-restarts)."))
    rdzv_backend: Literal["c10d", "etcd", ETCD_V3] = Field("c10d", description=(
        "Rendezvous backend: c10d (torch's TCPStore, in a small <job>-rdzv store pod by default or "
        "on node 0 with rdzvStore: node; no etcd needed), etcd (torch's etcd v2 backend) or etcd-v3 "
        "(ddpjob's etcd v3 backend)."),
        json_schema_extra=immutable(
            "spec.elasticPolicy.rdzvBackend", "nodes of one job must share one rendezvous"))
    rdzv_port: int = Field(C.DEFAULT_RDZV_PORT, ge=1, le=65535, description=(
        "Port of the c10d rendezvous store: the store pod's, or node 0's with rdzvStore: node (c10d only)."),
        json_schema_extra=immutable(
            "spec.elasticPolicy.rdzvPort", "nodes of one job must share one rendezvous"))
    rdzv_endpoints: list[Annotated[str, StringConstraints(max_length=MAX_ENDPOINT)]] = Field(
        default_factory=list, max_length=MAX_RDZV_ENDPOINTS, description=(
        "etcd client endpoints host:port (etcd backends only; etcd takes exactly one)."),
        json_schema_extra=immutable(
            "spec.elasticPolicy.rdzvEndpoints", "nodes of one job must share one rendezvous"))
    rdzv_secret_name: str | None = Field(None, max_length=253, pattern=SECRET_NAME_PATTERN, description=(
        "Secret (in the job's namespace) with the etcd client credentials, mounted read-only into "
        "every node pod and read by the operator to delete the job's rendezvous keys (etcd backends "
        "only). Keys: ca.crt (turns on TLS), tls.crt + tls.key (client certificate), username + "
        "password (etcd auth). etcd-v3 uses the keys present; torch's etcd (v2) backend needs ca.crt, "
        "tls.crt and tls.key and has no password auth."))
    # --- rendezvous isolation (docs/security.md) ---
    rdzv_allow_insecure_credentials: bool = Field(False, description=(
        "Let the etcd-v3 agents and the operator's key cleanup send the username and password of "
        "rdzvSecretName to etcd in plaintext when the Secret has no ca.crt. Off: such a Secret is "
        "refused when the agent starts (its error names this field), because whoever reads the "
        "password may write the rendezvous state, a pickle every agent loads. Only for networks "
        "you trust; rendered as rdzv_conf allow_insecure_credentials=true."))
    rdzv_timeouts: RdzvTimeouts = _object(RdzvTimeouts, "Rendezvous timeouts.")
    # Off by default: both halves are ddpjob-trainer code that must be in the job's image
    # (the project's trainer image has it; a bring-your-own image with plain torch does not).
    fast_restart: bool = Field(False, description=(
        "Restart workers faster after a failure or a membership change (docs/recovery.md). Needs "
        "ddpjob-trainer installed in the image (the Dockerfile's trainer target has it, docs/install.md; "
        "pip install ddpjob-trainer otherwise): without it the job fails at once (reason TrainerNotInImage). rdzvBackend c10d runs as "
        "ddpjob-c10d (torch's c10d rendezvous whose re-rendezvous completes once every node with a "
        "live heartbeat has joined, instead of waiting out lastCallSeconds, and drops a node whose "
        "agent is provably gone without waiting out its keep-alive; etcd-v3 does both anyway), and "
        "a module job's workers fork from a per-node server that imported torch once "
        "(torchrun -m ddpjob_trainer.zygote MODULE) instead of starting a fresh Python each. "
        "Applies to node pods created after a change."))
    managed_etcd: ManagedEtcd = _object(ManagedEtcd, "A per-job etcd run by the operator.")
    # No schema default: the API server would write `pod` into etcd jobs too, which the rule
    # above rejects; unset means pod for c10d (store_on_pod) and nothing for etcd backends.
    rdzv_store: Literal["node", "pod"] | None = Field(None, description=(
        "Where the c10d rendezvous store runs (c10d only; unset means pod): pod (a small "
        "dedicated pod <job>-rdzv behind a Service; every node joins as a client, so losing any "
        "node replaces only that node) or node (inside node 0's agent; losing node 0 restarts "
        "the whole group). Immutable, unset included (a rule on elasticPolicy)."))

    @property
    def store_location(self) -> Literal["pod", "node"] | None:
        """Where the c10d store lives, the one rule every reader follows: "pod" (a dedicated
        store pod; the default for c10d), "node" (node 0's agent hosts it) or None (an etcd
        backend: etcd is the store)."""
        if self.rdzv_backend != "c10d":
            return None
        return self.rdzv_store or "pod"

    @property
    def ddpjob_rendezvous(self) -> bool:
        """The nodes' agents run ddpjob's rendezvous handler (ddpjob_trainer/rendezvous/early.py):
        fastRestart (c10d becomes ddpjob-c10d) or the etcd-v3 backend. Only it reads
        replacementWaitSeconds (and completes re-rendezvous early, watches liveness beacons)."""
        return self.fast_restart or self.rdzv_backend == ETCD_V3

    @property
    def store_on_pod(self) -> bool:
        """The job runs a dedicated store pod (and, locally, a store process)."""
        return self.store_location == "pod"

    @property
    def store_on_node(self) -> bool:
        """Node 0's agent hosts the store: losing node 0 restarts the whole group."""
        return self.store_location == "node"


class NetworkIsolation(ApiModel):
    """The NetworkPolicy the operator creates for the job (networking.k8s.io/v1)."""

    enabled: bool = Field(True, description=(
        "Create NetworkPolicy <job>, owned by the job: the job's pods (nodes, the c10d store pod, a "
        "managed etcd) accept connections only from the job's node pods, and the trainer's progress "
        "port (29410) also from the operator's pods; egress stays open. Whoever can write the "
        "rendezvous store can run code in the job, so turn this off only where a policy of your own "
        "isolates the pods. Takes effect only where the network plugin enforces NetworkPolicy. "
        "Turning it off later stops the operator from creating the policy; it does not delete one "
        "that exists (kubectl delete networkpolicy <job>)."))


class Preflight(ApiModel):
    """An optional check in every node pod before it joins the rendezvous (render/preflight.py)."""

    enabled: bool = Field(False, description=(
        "Run init container `preflight` (the trainer image, python, no torch) in every node pod: it fails "
        "the pod within a second when the snapshot volume is not writable or fewer GPUs are visible than "
        "resources.limits[\"nvidia.com/gpu\"], before any other node waits for it in the rendezvous. The "
        "failure is listed with cause PreflightFailed (it counts against failurePolicy.maxRestarts) and a node "
        "that failed it alone is kept off for the rest of the job (status.avoidedNodes)."))


class Snapshot(ApiModel):
    """Where the trainer keeps snapshots; a shared volume lets a replaced node resume."""

    mount_path: MountPath = Field("/snapshots", description=(
        "Absolute path of the volume in every pod; DDPJOB_SNAPSHOT_DIR points here. Each job sees only its own "
        "directory of the volume, named after the job (the mount's subPath): jobs may share one claim "
        "without resuming from, overwriting or pruning each other's snapshots, and a job applied again "
        "under its name resumes from its own."))
    volume: KubeObject = Field(
        default_factory=lambda: {"emptyDir": {}}, min_length=1, max_length=1,
        description=(
            "core/v1 volume source with exactly one key, e.g. {persistentVolumeClaim: "
            "{claimName: x}}; a ReadWriteMany claim survives node loss, emptyDir does not."),
        json_schema_extra={"minProperties": 1, "maxProperties": 1, "default": {"emptyDir": {}}})
    keep: int = Field(2, ge=1, description="Complete snapshots kept; older ones are deleted.")
    on_unreadable: Literal["Fail", "StartOver"] = Field("Fail", description=(
        "What the trainer does when snapshot files exist but none can be read (corrupt, truncated, or "
        "refused by torch.load(weights_only=True)): Fail stops with an error naming each file and why, "
        "rather than silently training again from step 0; StartOver warns and trains from step 0. "
        "Rendered as DDPJOB_SNAPSHOT_ON_UNREADABLE."))
    graceful_stop_seconds: int = Field(30, ge=3, le=3600, description=(
        "Seconds a node pod gets after SIGTERM (preemption, eviction, scale-down, kubectl delete pod) "
        "to finish the step in flight and write a snapshot at it, so that the job resumes at exactly "
        "the next step. Rendered as the pods' terminationGracePeriodSeconds and, 2 s less, as "
        "torchrun's --shutdown-timeout (PET_SHUTDOWN_TIMEOUT), which otherwise SIGKILLs the workers "
        "30 s after SIGTERM whatever the pod's grace period (pytorch#119856). Set it above the "
        "longest blocking snapshot save (the trainer's stop event reports it); a node may enforce "
        "less (docs/recovery.md, What a stop costs)."))


class FailurePolicy(ApiModel):
    """When the operator replaces failed node pods and when it gives up (JobSet's name)."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        cel("!has(self.backoffSeconds) || !has(self.maxBackoffSeconds) || "
            "self.maxBackoffSeconds >= self.backoffSeconds",
            "spec.failurePolicy.maxBackoffSeconds must be >= spec.failurePolicy.backoffSeconds"),
    ]})

    max_restarts: int = Field(5, ge=0, description=(
        "Failure incidents the operator recovers from by replacing pods; one more fails the "
        "job. Nodes that were running when an incident began and fail within a minute of it join "
        "it (a cascade); a replacement that fails again starts a new one; evictions, "
        "preemptions, lost nodes and incidents after a newer snapshot do not count."))
    backoff_seconds: int = Field(10, ge=0, description=(
        "Delay before replacing the nodes of an incident that follows another with no newer "
        "snapshot in between (a crash loop); doubles with each such incident in a row. The job's "
        "first incident, and the first after a newer snapshot, are replaced at once, as a "
        "Kubernetes Job creates its second pod at once and backs off from the second failure."))
    max_backoff_seconds: int = Field(300, ge=0, description="Upper bound of the delay.")
    permanent_exit_codes: list[Annotated[int, Field(ge=1, le=255)]] = Field(
        default_factory=lambda: [126, 127], description=(
            "Exit codes that fail the job at once (126: not executable, 127: command not found)."),
        json_schema_extra={"default": [126, 127]})
    max_restarts_without_progress: int | None = Field(3, ge=0, description=(
        "Failure incidents in a row with no newer snapshot (the trainer reports its last complete "
        "snapshot) that the operator recovers from; one more fails the job with reason NoProgress. "
        "An incident after a newer snapshot resets this count and is not charged to maxRestarts, so "
        "a job that keeps making progress survives more failures than maxRestarts. null: no limit."))
    image_pull_timeout_seconds: int = Field(300, ge=0, description=(
        "Fail the job when a node pod still cannot pull its image (ErrImagePull, ImagePullBackOff) "
        "this long after it was created; InvalidImageName fails it at once."))
    force_delete_terminating_after_seconds: int | None = Field(60, ge=0, description=(
        "Force-delete (grace period 0) a node pod still terminating this long after its deletion "
        "deadline when its node is NotReady or gone, so its replacement can start; null: never. A job "
        f"queued through Kueue (scheduling.queueName) waits {C.KUEUE_FORCE_DELETE_HEAD_START_SECONDS} s more, so "
        "Kueue's own force-delete acts first."))
    # Off by default: a log tail may hold secrets, and readers of DDPJobs need not be allowed pods/log.
    include_log_tail: bool = Field(False, description=(
        "Copy the end of a failed trainer's log (its termination message under FallbackToLogsOnError, "
        "when it wrote no progress record) into status.failures and Events. Off: they say to see the "
        "pod's logs, which only those allowed pods/log can read."))
    hang_timeout_seconds: int | None = Field(None, ge=0, description=(
        "Restart the whole group from the last snapshot (a Hang incident, charged like a failure by "
        "the progress rule) when the pods run but no node's training step advanced for this long, "
        "as the operator reads it from the progress endpoint. null: max(600, 20 x the median step "
        "time); 0: off. Needs the operator to reach the pods' progress port (docs/hangs.md)."))
    collective_timeout_seconds: int = Field(300, ge=10, le=86400, description=(
        "Timeout of every collective in the trainer's process group (DDPJOB_COLLECTIVE_TIMEOUT_SECONDS, "
        "read by ddpjob_trainer.distributed): a collective stuck this long fails the workers, which "
        "torchrun restarts, instead of waiting torch's 10 minutes. It must outlast the longest "
        "wait of one rank for another, such as a synchronous snapshot write."))


class StragglerPolicy(ApiModel):
    """What the operator does about a node that is alive but slower than the others (docs/hangs.md)."""

    action: Literal["Ignore", "Report", "Replace"] = Field("Report", description=(
        "Report: status.progress names the slowest node and a Straggler Warning Event is posted when "
        "it stays slow for windowSeconds; Replace: that node's pod is also deleted and created "
        "again (not charged to the restart budget); Ignore: only status.progress."))
    threshold: float = Field(1.5, ge=1.0, le=1000.0, description=(
        "A node is slow when the group's step time is at least this many times what it would be "
        "if that node kept pace with the median node."))
    window_seconds: int = Field(120, ge=0, description=(
        "How long a node must stay slow before the Event (and a replacement)."))


class RunPolicy(ApiModel):
    """Lifetime of the job and its pods (Kubeflow's names)."""

    suspend: bool = Field(False, description="Delete all pods and pause; false resumes from the last snapshot.")
    active_deadline_seconds: int | None = Field(None, ge=1, description=(
        "Fail the job this long after it started (suspension restarts the clock)."))
    ttl_seconds_after_finished: int | None = Field(None, ge=0, description=(
        "Delete the finished job (and by ownership its pods) this long after it finished."))
    clean_pod_policy: Literal["None", "Running", "All"] = Field("Running", description=(
        "Pods deleted when the job finishes: None, Running (those still running) or All."))
    pod_disruption_budget: bool = Field(True, description=(
        "Keep a PodDisruptionBudget <job> (policy/v1, owned by the job) over the node pods and the "
        "rendezvous store pod, so a drain shrinks the job to elasticPolicy.minReplicas but no further, "
        "and a job at its minimum (every job whose minReplicas equals replicas) loses one pod at a "
        "time, each replaced before the next goes (docs/cluster.md). false: no budget; one that "
        "exists is deleted."))


MAX_SPREAD_CONSTRAINTS = 8  # most scheduling.topologySpreadConstraints (a bound for the CRD's cost estimate)


class TopologySpreadConstraint(ApiModel):
    """A core/v1 TopologySpreadConstraint, declared field by field so the CRD checks it at `kubectl apply`."""

    max_skew: int = Field(ge=1, description="Most the number of matching pods may differ between two domains.")
    topology_key: str = Field(min_length=1, max_length=317, description=(
        "Node label whose values are the domains, e.g. topology.kubernetes.io/zone or kubernetes.io/hostname."))
    when_unsatisfiable: Literal["DoNotSchedule", "ScheduleAnyway"] = Field(description=(
        "DoNotSchedule (a hard rule: the pod waits) or ScheduleAnyway (a preference)."))
    label_selector: KubeObject | None = Field(None, description=(
        "Pods counted (a metav1 LabelSelector). Default: this job's node pods."))
    match_label_keys: list[str] = Field(default_factory=list, max_length=16, description=(
        "Label keys whose values, taken from the incoming pod, narrow labelSelector."))
    min_domains: int | None = Field(None, ge=1, description="Fewest eligible domains (DoNotSchedule only).")
    node_affinity_policy: Literal["Honor", "Ignore"] | None = Field(None, description=(
        "Whether the pod's nodeAffinity/nodeSelector limit the domains counted."))
    node_taints_policy: Literal["Honor", "Ignore"] | None = Field(None, description=(
        "Whether node taints limit the domains counted."))


class Scheduling(ApiModel):
    """Where node pods may run (core/v1 PodSpec fields)."""

    node_selector: dict[str, LabelValue] = Field(default_factory=dict, description="Pod nodeSelector.")
    tolerations: list[KubeObject] = Field(default_factory=list, description="Pod tolerations.")
    affinity: KubeObject = Field(default_factory=dict, description=(
        "Pod affinity. The operator adds a required node anti-affinity to nodes listed in "
        "status.avoidedNodes (docs/cluster.md)."))
    topology_spread_constraints: list[TopologySpreadConstraint] = Field(
        default_factory=list, max_length=MAX_SPREAD_CONSTRAINTS, description=(
            "Pod topologySpreadConstraints of the node pods, e.g. spread over zones or hosts; "
            "each pair of topologyKey and whenUnsatisfiable at most once (the API server's rule). "
            "An entry without labelSelector counts this job's node pods."),
        json_schema_extra=list_map("topologyKey", "whenUnsatisfiable"))
    priority_class_name: str = Field("", description="Pod priorityClassName.")
    scheduler_name: str = Field("", description="Pod schedulerName (e.g. a gang scheduler).")
    pending_timeout_seconds: int = Field(120, ge=1, description=(
        "How long a node pod may wait for the scheduler before the job reports it as lacking "
        "capacity (condition NodesUnschedulable, with the scheduler's message, and an Event). "
        "It never blocks the job: training starts once minReplicas run, late pods join when "
        "scheduled."))
    queue_name: str | None = Field(None, min_length=1, max_length=63, pattern=LABEL_VALUE_PATTERN, description=(
        "Kueue LocalQueue that admits the node pods as one workload (Kueue's plain pod-group "
        "integration): sets the kueue.x-k8s.io/queue-name and pod-group-name labels, the "
        "pod-group-total-count annotation (= replicas) and safe-to-forcefully-delete: \"true\" (Kueue may "
        "force-delete a pod stuck on an unreachable node) on every node pod. The c10d store pod and a "
        "managed etcd pod get the queue-name label only: each is a one-pod Workload in the same quota."))


# --- Pod security and /dev/shm (render/common.py holds the defaults these merge over) ------

# A size in bytes above zero: a quantity without sign, milli or exponent, with at least one
# non-zero digit, so the CRD schema itself rejects "0" (no CEL rule needed).
SIZE_PATTERN = r"^([0-9]*[1-9][0-9]*(\.[0-9]*)?|[0-9]*\.[0-9]*[1-9][0-9]*)([KMGTPE]i|[kMGTPE])?$"
MAX_ID = 2147483647  # largest uid/gid Kubernetes accepts


def _check_size(value: Any) -> str:
    if isinstance(value, str) and re.match(SIZE_PATTERN, value):
        return value
    raise ValueError('must be a size in bytes above zero, written as a quantity string such as "8Gi" or "512Mi"')


Size = Annotated[str, PlainValidator(_check_size), WithJsonSchema({"type": "string", "pattern": SIZE_PATTERN})]
Id = Annotated[int, Field(ge=0, le=MAX_ID)]


class SeccompProfile(ApiModel):
    """core/v1 SeccompProfile."""

    type: Literal["RuntimeDefault", "Localhost", "Unconfined"] = Field(description=(
        "RuntimeDefault (the container runtime's filter), Localhost (a file on the node) or Unconfined."))
    localhost_profile: str | None = Field(None, description="Path of the profile on the node (Localhost only).")


class AppArmorProfile(ApiModel):
    """core/v1 AppArmorProfile."""

    type: Literal["RuntimeDefault", "Localhost", "Unconfined"] = Field(description=(
        "RuntimeDefault, Localhost (a profile loaded on the node) or Unconfined."))
    localhost_profile: str | None = Field(None, description="Name of the profile (Localhost only).")


class SELinuxOptions(ApiModel):
    """core/v1 SELinuxOptions."""

    level: str | None = Field(None, description="SELinux level label.")
    role: str | None = Field(None, description="SELinux role label.")
    type: str | None = Field(None, description="SELinux type label.")
    user: str | None = Field(None, description="SELinux user label.")


class Capabilities(ApiModel):
    """core/v1 Capabilities."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        # Cost: <= MAX_CAPABILITIES names x one `in` over 14 constants of <= MAX_CAPABILITY_NAME characters.
        cel("!has(self.add) || self.add.all(c, c in " + json.dumps(list(SAFE_CAPABILITIES)).replace('"', "'") + ")",
            f"spec.podOverrides.containerSecurityContext.capabilities.add may add only {', '.join(SAFE_CAPABILITIES)}"),
    ]})

    add: list[Annotated[str, Field(max_length=MAX_CAPABILITY_NAME)]] | None = Field(
        None, max_length=MAX_CAPABILITIES, description=(
            "Capabilities to add, from " + ", ".join(SAFE_CAPABILITIES) + " (Pod Security baseline's, plus "
            "IPC_LOCK for RDMA); only a process running as root gets them (the runtime sets no ambient capabilities)."))
    drop: list[str] | None = Field(None, description="Capabilities to drop; the default drops ALL.")


class Sysctl(ApiModel):
    """core/v1 Sysctl."""

    name: str = Field(min_length=1, description="Sysctl name, e.g. net.ipv4.ip_unprivileged_port_start.")
    value: str = Field(description="Its value.")


class _SecurityContext(ApiModel):
    """Fields a pod and a container securityContext share (core/v1)."""

    run_as_user: Id | None = Field(None, description=f"uid of the container processes (default {C.POD_UID}).")
    run_as_group: Id | None = Field(None, description=f"Primary gid of the container processes (default {C.POD_GID}).")
    run_as_non_root: bool | None = Field(None, description=(
        "The kubelet refuses to start a container that would run as uid 0 (default true)."))
    seccomp_profile: SeccompProfile | None = Field(None, description="Seccomp filter (default RuntimeDefault).")
    app_armor_profile: AppArmorProfile | None = Field(None, description="AppArmor profile.")
    se_linux_options: SELinuxOptions | None = Field(None, description="SELinux labels.")


class PodSecurityContext(_SecurityContext):
    """A pod securityContext (core/v1 PodSecurityContext) merged field by field over the operator's."""

    fs_group: Id | None = Field(None, description=(
        f"gid that owns the pod's volumes (default {C.POD_GID}, so the non-root user can write the snapshot volume)."))
    fs_group_change_policy: Literal["OnRootMismatch", "Always"] | None = Field(None, description=(
        "When the kubelet re-owns a volume for fsGroup (default OnRootMismatch: only when its root "
        "directory is not owned yet, so a replaced pod does not walk a large snapshot volume again)."))
    supplemental_groups: list[Id] | None = Field(None, description="Further gids of the container processes.")
    sysctls: list[Sysctl] | None = Field(None, description="Namespaced sysctls of the pod.")


class ContainerSecurityContext(_SecurityContext):
    """A container securityContext (core/v1 SecurityContext) merged field by field over the operator's."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        cel("!has(self.privileged) || !self.privileged",
            f"spec.podOverrides.containerSecurityContext.privileged {PRIVILEGED_RULE}"),
        cel("!has(self.allowPrivilegeEscalation) || !self.allowPrivilegeEscalation",
            f"spec.podOverrides.containerSecurityContext.allowPrivilegeEscalation {ESCALATION_RULE}"),
    ]})

    allow_privilege_escalation: bool | None = Field(None, description=(
        "Whether a process may gain more privileges than its parent, e.g. through setuid binaries (default false)."))
    capabilities: Capabilities | None = Field(None, description=(
        "Linux capabilities (default: drop ALL); replaces the default as a whole."))
    privileged: bool | None = Field(None, description="Run with the host's full privileges (never by default).")
    proc_mount: Literal["Default", "Unmasked"] | None = Field(None, description="How /proc is masked.")
    read_only_root_filesystem: bool | None = Field(None, description=(
        "Mount the image read-only (default: not set for the trainer, since torchrun writes its logs under /tmp; "
        "set it together with a /tmp emptyDir in volumes and volumeMounts)."))


def _without_keys(path: str, keys: tuple[str, ...], why: str) -> dict[str, Any]:
    """json_schema_extra of a map that may not hold Kueue's `keys` (`in` on a map costs O(1))."""
    return {"x-kubernetes-validations": [cel(" && ".join(f"!('{k}' in self)" for k in keys),
                                             f"{path} may not set Kueue's {', '.join(keys)}: {why}")]}


class PodOverrides(ApiModel):
    """Extra settings copied into every node pod."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        # `in` on a map costs O(1); a rule iterating the keys would exceed the CEL cost budget.
        cel("!has(self.labels) || (" + " && ".join(f"!('{k}' in self.labels)" for k in RESERVED_LABELS) + ")",
            "spec.podOverrides.labels may not set the labels the operator selects pods by"),
        # Cost: <= MAX_VOLUMES (64) names x one `in` over 3 constants of <= 63 characters.
        cel("!has(self.volumes) || self.volumes.all(v, !(v.name in "
            + json.dumps(list(RESERVED_VOLUMES)).replace('"', "'") + "))",
            "spec.podOverrides.volumes may not use the volume names the operator adds ("
            + ", ".join(RESERVED_VOLUMES) + ")"),
    ]})

    service_account_name: str = Field("", description=(
        "Pod serviceAccountName of the node pods and the rendezvous store pod. Empty: no ServiceAccount "
        "token is mounted (automountServiceAccountToken: false; training reports progress without API "
        "access). Set: the account's own automountServiceAccountToken decides."))
    image_pull_secrets: list[KubeObject] = Field(default_factory=list, description=(
        "Pod imagePullSecrets ([{name: secret}])."))
    security_context: PodSecurityContext = Field(default_factory=PodSecurityContext, description=(
        f"Pod securityContext of the node pods and the rendezvous store pod, merged over the operator's "
        f"(runAsNonRoot, runAsUser/runAsGroup/fsGroup {C.POD_UID}, seccomp RuntimeDefault): a field set "
        "here replaces the operator's value of that field."))
    container_security_context: ContainerSecurityContext = Field(
        default_factory=ContainerSecurityContext, description=(
            "securityContext of the trainer container, merged over the operator's (allowPrivilegeEscalation "
            "false, capabilities drop ALL): a field set here replaces the operator's value of that field. "
            "The rendezvous store container keeps the defaults."))
    volumes: list[Annotated[KubeObject, WithJsonSchema(VOLUME_SCHEMA)]] = Field(
        default_factory=list, max_length=MAX_VOLUMES, description="Extra pod volumes (each name once).",
        json_schema_extra=list_map("name"))
    volume_mounts: list[Annotated[KubeObject, WithJsonSchema(MOUNT_SCHEMA)]] = Field(
        default_factory=list, max_length=MAX_VOLUME_MOUNTS, description=(
            "Extra volume mounts of the trainer container (each mountPath once)."),
        json_schema_extra=list_map("mountPath"))
    labels: dict[str, LabelValue] = Field(default_factory=dict, description=(
        "Extra pod labels (not the operator's own, nor Kueue's " + ", ".join(RESERVED_KUEUE_LABELS) + ")."),
        json_schema_extra=_without_keys("spec.podOverrides.labels", RESERVED_KUEUE_LABELS,
                                        "the operator sets them from spec.scheduling.queueName"))
    annotations: dict[str, str] = Field(default_factory=dict, description=(
        "Extra pod annotations (not Kueue's " + ", ".join(RESERVED_KUEUE_ANNOTATIONS) + ")."),
        json_schema_extra=_without_keys("spec.podOverrides.annotations", RESERVED_KUEUE_ANNOTATIONS,
                                        "the operator sets it from spec.replicas"))



def _mount_rules() -> list[dict[str, str]]:
    """CEL twins of validation._mount_errors. Cost, as the API server estimates it (the largest
    input the schema allows): <= MAX_VOLUME_MOUNTS (64) mounts x (3 string comparisons of <= MAX_PATH
    (4096) characters, ~410 units each, + an exists over <= MAX_VOLUMES (64) names of <= 63
    characters, ~8 units each) ~ 64 x 1750 ~ 112k units per rule: about 1% of its per-expression
    estimate limit (10M, apiextensions' StaticEstimatedCostLimit)."""
    mounts = "!has(self.podOverrides) || !has(self.podOverrides.volumeMounts) || self.podOverrides.volumeMounts.all(m, {})"
    secret = "has(self.elasticPolicy) && has(self.elasticPolicy.rdzvSecretName)"
    snapshot_path = "(has(self.snapshot.mountPath) ? self.snapshot.mountPath : '/snapshots')"
    return [
        cel(mounts.format(
            f"m.mountPath != '{C.SHM_MOUNT_PATH}' && !(has(self.snapshot) && m.mountPath == {snapshot_path}) && "
            f"!({secret} && m.mountPath == '{C.RDZV_SECRET_MOUNT_PATH}')"),
            "spec.podOverrides.volumeMounts may not mount over /dev/shm, spec.snapshot.mountPath or the "
            f"rdzvSecretName mount {C.RDZV_SECRET_MOUNT_PATH}"),
        cel(mounts.format(
            f"m.name == '{C.SHM_VOLUME}' || (has(self.snapshot) && m.name == '{C.SNAPSHOT_VOLUME}') || "
            f"({secret} && m.name == '{C.RDZV_SECRET_VOLUME}') || "
            "(has(self.podOverrides.volumes) && self.podOverrides.volumes.exists(v, v.name == m.name))"),
            "spec.podOverrides.volumeMounts must each name a volume of the pod: one of "
            f"spec.podOverrides.volumes, {C.SHM_VOLUME}, {C.SNAPSHOT_VOLUME} (with spec.snapshot) or "
            f"{C.RDZV_SECRET_VOLUME} (with rdzvSecretName)"),
    ]


def _replica_range(obj: str) -> tuple[str, str]:
    """CEL for the minReplicas and maxReplicas the operator resolves from spec `obj` (self or
    oldSelf), the defaults of `_resolve_replica_defaults`: minReplicas is replicas (else 1),
    maxReplicas the larger of minReplicas and replicas."""
    replicas = f"(has({obj}.replicas) ? {obj}.replicas : 0)"
    low = (f"({_replica_field_given(obj, 'minReplicas')} ? {obj}.elasticPolicy.minReplicas : "
           f"(has({obj}.replicas) ? {obj}.replicas : 1))")
    high = (f"({_replica_field_given(obj, 'maxReplicas')} ? {obj}.elasticPolicy.maxReplicas : "
            f"({replicas} > {low} ? {replicas} : {low}))")
    return low, high


def _replica_field_given(obj: str, name: str) -> str:
    return f"(has({obj}.elasticPolicy) && has({obj}.elasticPolicy.{name}))"


SIZE_RULE = ("may not change once the job exists: its torchrun agents were started with --nnodes "
             "minReplicas:maxReplicas (unset, both default to spec.replicas, so a job created without "
             "them keeps its size); delete and recreate the job to change them")


def _size_rule() -> dict[str, str]:
    """The transition rule that keeps a job's size within what its running agents were started with.

    torchrun's --nnodes MIN:MAX is fixed when an agent starts, so a node pod created later with
    another range would join a rendezvous that does not admit it. The rule compares the effective
    range (defaults resolved) of the new and the stored spec: a field-level `self == oldSelf` runs
    only when both objects set the field, so it let `minReplicas` be added later, and it says
    nothing of `kubectl scale` (the scale subresource writes spec.replicas, and runs this rule) on
    a job whose range defaults to replicas. spec.replicas itself may move within the range (the
    rules above). There is no pydantic twin: `ddpjob validate` reads one file, not a change.
    """
    (low, high), (old_low, old_high) = _replica_range("self"), _replica_range("oldSelf")
    unset = " && ".join(f"!{_replica_field_given(obj, name)}"
                        for obj in ("self", "oldSelf") for name in ("minReplicas", "maxReplicas"))
    # r: [min, max, old min, old max]. A map over a one-element list names the four ranges once,
    # as cel.bind would (cel-python, which tests/operator/api/test_crd_cel.py runs the rules
    # with, has no cel.bind); each then appears once instead of once per digit.
    low_text, high_text, old_low_text, old_high_text = (cel_int_text(f"r[{i}]") for i in range(4))
    fixed = (f"'spec.replicas (' + {low_text} + ') may not change from ' + {old_low_text} + ': the job has no "
             f"spec.elasticPolicy.minReplicas or maxReplicas, so its torchrun agents were started with --nnodes ' + "
             f"{old_low_text} + ':' + {old_high_text} + ' (both default to spec.replicas); delete and recreate the "
             "job with the minReplicas and maxReplicas it may be scaled within'")
    ranged = (f"'spec.elasticPolicy minReplicas:maxReplicas (' + {low_text} + ':' + {high_text} + ') may not "
              f"change from ' + {old_low_text} + ':' + {old_high_text} + ', the --nnodes its torchrun agents "
              "were started with (unset, both default to spec.replicas); delete and recreate the job to change them'")
    return cel(f"{low} == {old_low} && {high} == {old_high}",
               f"spec.elasticPolicy minReplicas:maxReplicas {SIZE_RULE}",
               f"[[{low}, {high}, {old_low}, {old_high}]].map(r, ({unset}) ? {fixed} : {ranged})[0]")


SPARE_RULE = ("needs a full group: a spare waits outside the round only while the round holds "
              "maxReplicas nodes (below it, torchrun would admit the spare into the group), so "
              "spec.replicas must equal spec.elasticPolicy.maxReplicas")


def _spare_rule() -> dict[str, str]:
    """spareReplicas > 0 needs the effective replicas equal to the effective maxReplicas (validation's
    _spare_errors is the twin). torchrun parks a node in the redundancy list only when the round is
    complete at max_nodes; below that the "spare" would join the group and train."""
    low, high = _replica_range("self")
    replicas = f"(has(self.replicas) ? self.replicas : {low})"
    spares = "self.elasticPolicy.spareReplicas"
    given = f"has(self.elasticPolicy) && has({spares})"
    # r: [spares, replicas, maxReplicas], named once (see _size_rule).
    text = [cel_int_text(f"r[{i}]") for i in range(3)]
    message = (f"'spec.elasticPolicy.spareReplicas (' + {text[0]} + ') needs a full group: a spare waits outside "
               "the round only while the round holds maxReplicas nodes (below it, torchrun would admit the "
               f"spare into the group), so spec.replicas (' + {text[1]} + ') must equal "
               f"spec.elasticPolicy.maxReplicas (' + {text[2]} + ')'")
    return cel(f"!({given}) || {spares} == 0 || {replicas} == {high}",
               f"spec.elasticPolicy.spareReplicas {SPARE_RULE}",
               f"[[{spares}, {replicas}, {high}]].map(r, {message})[0]")


def _spec_rules() -> list[dict[str, str]]:
    """CEL twins of the cross-field rules of validation.py that span several spec fields."""
    ep = "has(self.elasticPolicy) && has(self.elasticPolicy.{0})"
    return [
        cel("has(self.module) != has(self.script)",
            "exactly one of spec.module or spec.script must be set"),
        cel(f"!has(self.replicas) || !({ep.format('minReplicas')}) || "
            "self.replicas >= self.elasticPolicy.minReplicas",
            "spec.replicas must be >= spec.elasticPolicy.minReplicas",
            f"'spec.replicas (' + {cel_int_text('self.replicas')} + ') must be >= "
            f"spec.elasticPolicy.minReplicas (' + {cel_int_text('self.elasticPolicy.minReplicas')} + ')'"),
        cel(f"!has(self.replicas) || !({ep.format('maxReplicas')}) || "
            "self.replicas <= self.elasticPolicy.maxReplicas",
            "spec.replicas must be <= spec.elasticPolicy.maxReplicas",
            f"'spec.replicas (' + {cel_int_text('self.replicas')} + ') must be <= "
            f"spec.elasticPolicy.maxReplicas (' + {cel_int_text('self.elasticPolicy.maxReplicas')} + ')'"),
        _size_rule(),
        _spare_rule(),
        cel(f"!({ep.format('nProcPerNode')}) || type(self.elasticPolicy.nProcPerNode) == int || "
            "self.elasticPolicy.nProcPerNode != 'gpu' || (has(self.resources) && "
            f"has(self.resources.limits) && '{GPU_RESOURCE}' in self.resources.limits)",
            f'spec.elasticPolicy.nProcPerNode "gpu" needs spec.resources.limits["{GPU_RESOURCE}"]'),
        cel("!has(self.env) || self.env.all(e, !(e.name in "
            + json.dumps(sorted(RESERVED_ENV)).replace('"', "'") + "))",
            "spec.env may not set variables the operator derives from the spec "
            "(PET_*, DDPJOB_*): use the spec field instead"),
    ] + _mount_rules()


class DDPJobSpec(ApiModel):
    """Desired state of an elastic PyTorch DDP training job."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": _spec_rules()})

    # At most MAX_REPLICAS (1000) nodes: a bound on typos (100000) rather than a tested scale.
    # A c10d rendezvous serves every agent's keep-alives from one TCPStore, each pass of the
    # operator lists and judges every pod, and 1000 nodes of 8 GPUs is beyond the data-parallel
    # jobs this operator is for; node indexes up to 999 also leave job names 54 characters.
    replicas: int | None = Field(None, ge=1, le=MAX_REPLICAS, description=(
        "Desired nodes (pods); between minReplicas and maxReplicas. Changed by kubectl scale, "
        "within the minReplicas and maxReplicas the job was created with. Default: elasticPolicy.minReplicas."))
    image: str = Field(min_length=1, max_length=MAX_IMAGE, pattern=IMAGE_PATTERN,
                       description="Container image with torch and the training code.",
                       json_schema_extra=immutable(
                           "spec.image", "all nodes of a DDP group must run the same code"))
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        "IfNotPresent", description="Container imagePullPolicy.")
    module: str | None = Field(None, min_length=1, max_length=MAX_NAME, pattern=MODULE_PATTERN, description=(
        "Python module to run (torchrun -m MODULE); exactly one of module or script."),
        json_schema_extra=immutable("spec.module", "all nodes of a DDP group must run the same code"))
    script: str | None = Field(None, min_length=1, max_length=MAX_PATH, description=(
        "Path of the training script in the image; exactly one of module or script."),
        json_schema_extra=immutable("spec.script", "all nodes of a DDP group must run the same code"))
    args: list[str] = Field(default_factory=list, description="Arguments of the module or script.")
    # maxItems bounds the cost the API server estimates for the CEL rule over env; a list map,
    # so a name set twice (the later entry would silently win) is refused at `kubectl apply`.
    env: list[EnvVar] = Field(default_factory=list, max_length=MAX_ENV, description=(
        "Extra environment (core/v1 EnvVar list, each name once); entries come after the "
        "operator's and win, except the reserved PET_*/DDPJOB_* names, which are rejected."),
        json_schema_extra=list_map("name"))
    resources: Resources = _object(Resources, "Resources of the trainer container.")
    shared_memory_size: Size | None = Field(None, description=(
        "sizeLimit of the memory-backed /dev/shm of the node pods (DataLoader workers and NCCL pass "
        "tensors through it; its pages count against the memory limit). Default: half of "
        "resources.limits.memory, at least 256Mi but never above the limit; 8Gi without a memory limit. "
        "The kubelet caps it at the pod's memory limit."))
    elastic_policy: ElasticPolicy = _object(ElasticPolicy, "Elastic rendezvous settings.")
    snapshot: Snapshot | None = Field(None, description=(
        "Snapshot volume; without it the job cannot resume after a failure."))
    failure_policy: FailurePolicy = _object(FailurePolicy, "Pod replacement policy.")
    straggler_policy: StragglerPolicy = _object(StragglerPolicy, "Slow-node detection and replacement.")
    run_policy: RunPolicy = _object(RunPolicy, "Suspension, deadline and cleanup.")
    scheduling: Scheduling = _object(Scheduling, "Pod placement.")
    pod_overrides: PodOverrides = _object(PodOverrides, "Extra pod settings.")
    # --- rendezvous isolation (docs/security.md) ---
    network_policy: NetworkIsolation = _object(NetworkIsolation, "Network isolation of the job's pods.")
    preflight: Preflight = _object(Preflight, "Pre-flight check of every node pod (docs/cluster.md).")

    @model_validator(mode="after")
    def _resolve_defaults(self) -> DDPJobSpec:
        _resolve_replica_defaults(self)
        return self

    @property
    def min_replicas(self) -> int:
        """Resolved elasticPolicy.minReplicas."""
        return self.elastic_policy.min_replicas  # type: ignore[return-value]

    @property
    def max_replicas(self) -> int:
        """Resolved elasticPolicy.maxReplicas."""
        return self.elastic_policy.max_replicas  # type: ignore[return-value]

    @property
    def desired_replicas(self) -> int:
        """Resolved replicas."""
        return self.replicas  # type: ignore[return-value]

    @property
    def spare_replicas(self) -> int:
        """Warm spare node pods wanted beyond replicas (elasticPolicy.spareReplicas)."""
        return self.elastic_policy.spare_replicas

    @property
    def node_pods(self) -> int:
        """Node pods the job wants: replicas, then the spares (indexes replicas .. node_pods - 1)."""
        return self.desired_replicas + self.spare_replicas


def _resolve_replica_defaults(spec: DDPJobSpec) -> None:
    # Written through __dict__ so model_fields_set keeps telling given fields from defaults.
    ep = spec.elastic_policy
    if ep.min_replicas is None:
        ep.__dict__["min_replicas"] = spec.replicas or 1
    if ep.max_replicas is None:
        ep.__dict__["max_replicas"] = max(ep.min_replicas, spec.replicas or 0)
    if spec.replicas is None:
        spec.__dict__["replicas"] = ep.min_replicas

