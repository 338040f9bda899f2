"""The DDPJob spec: pydantic models, defaults and validation rules.

This module is the single source of truth for the API. `crd.py` turns these
models into the CRD's openAPIV3Schema (descriptions, enums, minimums, defaults
and the CEL rules attached here with `cel(...)`), the README field reference is
generated from them, and the operator and `ddpjob run` parse user input with
`parse_spec`. Every CEL rule has a pydantic twin in `_cross_field_errors`, so a
rule the API server could not run (old cluster, `kubectl apply --validate=false`,
local runs) is still enforced, reported as InvalidSpec.

Defaults that depend on other fields (they cannot live in the CRD schema):
  * `elasticPolicy.minReplicas` defaults to `replicas` (1 when neither is set);
  * `elasticPolicy.maxReplicas` defaults to max(`minReplicas`, `replicas`);
  * `replicas` defaults to `minReplicas`: a job starts with the nodes it needs
    and grows through the scale subresource (kubectl scale, an autoscaler).
So `replicas: 3` alone is a fixed-size 3-node job, and `elasticPolicy: {minReplicas: 2,
maxReplicas: 8}` alone starts 2 nodes and may be scaled to 8.
"""

from __future__ import annotations

import difflib
import functools
import json
import re
from dataclasses import dataclass

from typing import Annotated, Any, Literal, Mapping, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    model_validator,
)
from pydantic.alias_generators import to_camel

from ddpjob_rdzv import BACKEND_NAME as ETCD_V3  # ddpjob's torchrun backend; defined where both sides read it

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.names import name_too_long
from ddpjob_operator.api.quantity import parse_quantity

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
KUEUE_RULE = ("may not be set: Kueue admits pods by it, and the operator sets it from spec.scheduling.queueName "
              "(set there, it cannot join another job's pod group)")
# Capabilities a job may add: Pod Security "baseline"'s list, plus IPC_LOCK, which lifts only the
# locked-memory limit that RDMA (NCCL over InfiniBand) pins its buffers under. Anything else
# (SYS_ADMIN, NET_ADMIN, SYS_PTRACE, ...) reaches past the container; a namespace that wants it
# runs the pods itself. Only a root process gets added capabilities anyway (no ambient set).
SAFE_CAPABILITIES = ("AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "IPC_LOCK", "KILL", "MKNOD",
                     "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT")
CAPABILITY_RULE = ("is not a capability a job may add: only " + ", ".join(SAFE_CAPABILITIES)
                   + " (Pod Security baseline's, plus IPC_LOCK for RDMA)")
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
# A label or annotation key: an optional DNS-1123 subdomain prefix (<= 253) and '/', then a name
# of <= 63 characters; checked by qualified_name_problem (lengths included).
QUALIFIED_NAME = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
DNS_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"

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
# What a string field's pattern means, in the words an error message uses.
PATTERN_RULES = {
    SECRET_NAME_PATTERN: "must be a DNS-1123 subdomain: lowercase letters, digits, '-' and '.', "
                         "starting and ending with a letter or digit",
    LABEL_VALUE_PATTERN: "must be a label value: letters, digits, '-', '_' and '.', starting and ending "
                         "with a letter or digit",
    VOLUME_NAME_PATTERN: "must be a DNS-1123 label: lowercase letters, digits and '-', starting and "
                         "ending with a letter or digit",
    ENV_NAME_PATTERN: "must be a C-identifier-like name: letters, digits, '_', '-' and '.', not "
                      "starting with a digit",
    MODULE_PATTERN: "must be a dotted Python module name such as pkg.train (a file path goes in spec.script)",
    IMAGE_PATTERN: "must be an image reference without whitespace",
    r"^/": "must be an absolute path (start with /)",
}

# Size limits. Each list or string a CEL rule walks has a maximum, so the API server's cost
# estimate (it assumes the largest input the schema allows) stays within its per-rule budget.
MAX_REPLICAS = 1000  # most nodes a job may ask for (replicas, minReplicas, maxReplicas); see DDPJobSpec
MAX_ENV = 128  # most spec.env entries
MAX_RESOURCES = 32  # most resource names in limits or requests (each runs the quantity rule)
MAX_VOLUMES = 64  # most spec.podOverrides.volumes
MAX_VOLUME_MOUNTS = 64  # most spec.podOverrides.volumeMounts
MAX_PATH = 4096  # longest mountPath: Linux's PATH_MAX
MAX_IMAGE = 1024  # longest image: a reference is at most 255 (name) + 129 (tag) + 136 (sha512 digest)
MAX_NAME = 253  # longest env var, module or script name we accept (a DNS subdomain's length)
MAX_RDZV_ENDPOINTS = 16  # most etcd endpoints: a cluster of 3 to 7 members, with room to spare
MAX_ENDPOINT = 261  # longest host:port: a DNS name (253) + ':' + a port (5) + IPv6 brackets (2)
# The API server stores an object in one etcd request, and etcd refuses requests over its
# --max-request-bytes (1.5 MiB by default): a larger DDPJob fails at `kubectl apply` with
# "etcdserver: request is too large". (Client-side `kubectl apply` also copies the object into
# an annotation limited to 256 KiB; `kubectl create` and server-side apply do not.)
OBJECT_SIZE_LIMIT = 1536 * 1024
# No DDPJob field is nested deeper than 12 levels (spec.scheduling.affinity.podAntiAffinity...
# matchExpressions[].values[]); a deeper document is broken or hostile, and the operator's own
# copies of it (render, kopf) recurse. Checked without recursion, before anything else.
MAX_DEPTH = 32


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

# A Kubernetes object this API passes through unchanged (affinity, a volume source, ...):
# typed loosely on purpose, the API server validates it when the pod is created.
KubeObject = dict[str, Any]

# A label value (podOverrides.labels, scheduling.nodeSelector); the API server checks it only
# when the pod is created, so the CRD checks it here. Keys are checked by the operator
# (qualified_name_problem): a CEL rule over a map's keys has no length bound to estimate with.
LabelValue = Annotated[str, Field(max_length=63, pattern=LABEL_VALUE_PATTERN)]

# The clean absolute path the kubelet will mount at: no '.', '..' or empty segment and no
# trailing '/' (so two spellings of one directory cannot slip past the "already mounted"
# rules, which compare strings). Segment = anything but '.' and '..', spelt without lookahead
# because the API server's regex engine (RE2) has none.
MOUNT_PATH_PATTERN = r"^(/([^/.][^/]*|[.][^/.][^/]*|[.][.][^/]+))+$"
PATTERN_RULES[MOUNT_PATH_PATTERN] = ("must be a clean absolute path such as /data: no '.', '..' or "
                                     "empty segments and no trailing /")
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


class _Model(BaseModel):
    """camelCase on the wire, snake_case in Python; unknown fields are errors (typos).

    Strict: the API server's schema refuses `replicas: true` or "2" and a string given as a
    number, so the operator and `ddpjob validate` do too. (A whole float such as 2.0 reaches
    the API server as 2, because kubectl writes JSON with Go's encoder; `ddpjob validate`
    reads YAML the same way: see cli._KubectlLoader.)
    """

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", strict=True)


def _object(model: type[BaseModel], description: str, **extra: Any) -> Any:
    """An optional nested object that defaults to all of its own defaults.

    The CRD gets `default: {}` so the API server fills the nested defaults in too.
    """
    return Field(default_factory=model, description=description,
                 json_schema_extra={"default": {}, **extra})


# --- The spec ----------------------------------------------------------------

class EnvVar(_Model):
    """A core/v1 EnvVar: a literal value or a reference (valueFrom)."""

    name: str = Field(min_length=1, max_length=MAX_NAME, pattern=ENV_NAME_PATTERN, description="Variable name.")
    value: str | None = Field(None, description="Literal value.")
    value_from: KubeObject | None = Field(
        None, description="core/v1 EnvVarSource (secretKeyRef, configMapKeyRef, fieldRef, ...).")


class Resources(_Model):
    """Compute resources of the trainer container (core/v1 ResourceRequirements)."""

    limits: dict[str, Quantity] = Field(
        default_factory=dict, max_length=MAX_RESOURCES,
        description="Maximum resources, e.g. {cpu: \"4\", memory: 16Gi, nvidia.com/gpu: 1}.")
    requests: dict[str, Quantity] = Field(
        default_factory=dict, max_length=MAX_RESOURCES,
        description="Guaranteed resources (each <= its limit); default to the limits.")


class RdzvTimeouts(_Model):
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


class ManagedEtcd(_Model):
    """A single-member etcd the operator runs for this job alone (etcd backends only)."""

    enabled: bool = Field(False, description=(
        "Run a one-member etcd (pod and Service <job>-etcd, owned by the job) and point the nodes "
        "at it; rdzvEndpoints must then be empty. Plaintext, no auth, data on an emptyDir: for "
        "jobs that want etcd's rendezvous without an etcd to share; the job's NetworkPolicy "
        "(spec.networkPolicy) admits only the job's node pods. Deleted when the job finishes."))
    image: str = Field(C.MANAGED_ETCD_IMAGE, min_length=1, description=(
        "etcd image; 3.5 still serves the v2 API that rdzvBackend etcd needs."))


class ElasticPolicy(_Model):
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
        "ddpjob-trainer installed in the image (ghcr.io/ddpjob/trainer has it; pip install "
        "ddpjob-trainer otherwise): without it the agents fail to start. rdzvBackend c10d runs as "
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
    def store_on_pod(self) -> bool:
        """The job runs a dedicated store pod (and, locally, a store process)."""
        return self.store_location == "pod"

    @property
    def store_on_node(self) -> bool:
        """Node 0's agent hosts the store: losing node 0 restarts the whole group."""
        return self.store_location == "node"


class NetworkIsolation(_Model):
    """The NetworkPolicy the operator creates for the job (networking.k8s.io/v1)."""

    enabled: bool = Field(True, description=(
        "Create NetworkPolicy <job>, owned by the job: the job's pods (nodes, the c10d store pod, a "
        "managed etcd) accept connections only from the job's node pods, and the trainer's progress "
        "port (29410) also from the operator's pods; egress stays open. Whoever can write the "
        "rendezvous store can run code in the job, so turn this off only where a policy of your own "
        "isolates the pods. Takes effect only where the network plugin enforces NetworkPolicy. "
        "Turning it off later stops the operator from creating the policy; it does not delete one "
        "that exists (kubectl delete networkpolicy <job>)."))


class Preflight(_Model):
    """An optional check in every node pod before it joins the rendezvous (render/preflight.py)."""

    enabled: bool = Field(False, description=(
        "Run init container `preflight` (the trainer image, python, no torch) in every node pod: it fails "
        "the pod within a second when the snapshot volume is not writable or fewer GPUs are visible than "
        "resources.limits[\"nvidia.com/gpu\"], before any other node waits for it in the rendezvous. The "
        "failure is listed with cause PreflightFailed (it counts against failurePolicy.maxRestarts) and a node "
        "that failed it alone is kept off for the rest of the job (status.avoidedNodes)."))


class Snapshot(_Model):
    """Where the trainer keeps snapshots; a shared volume lets a replaced node resume."""

    mount_path: MountPath = Field("/snapshots", description=(
        "Absolute path of the volume in every pod; DDPJOB_SNAPSHOT_DIR points here."))
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


class FailurePolicy(_Model):
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
        "Delay before the first replacement; doubles with each incident."))
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


class StragglerPolicy(_Model):
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


class RunPolicy(_Model):
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


class TopologySpreadConstraint(_Model):
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


class Scheduling(_Model):
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


class SeccompProfile(_Model):
    """core/v1 SeccompProfile."""

    type: Literal["RuntimeDefault", "Localhost", "Unconfined"] = Field(description=(
        "RuntimeDefault (the container runtime's filter), Localhost (a file on the node) or Unconfined."))
    localhost_profile: str | None = Field(None, description="Path of the profile on the node (Localhost only).")


class AppArmorProfile(_Model):
    """core/v1 AppArmorProfile."""

    type: Literal["RuntimeDefault", "Localhost", "Unconfined"] = Field(description=(
        "RuntimeDefault, Localhost (a profile loaded on the node) or Unconfined."))
    localhost_profile: str | None = Field(None, description="Name of the profile (Localhost only).")


class SELinuxOptions(_Model):
    """core/v1 SELinuxOptions."""

    level: str | None = Field(None, description="SELinux level label.")
    role: str | None = Field(None, description="SELinux role label.")
    type: str | None = Field(None, description="SELinux type label.")
    user: str | None = Field(None, description="SELinux user label.")


class Capabilities(_Model):
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


class Sysctl(_Model):
    """core/v1 Sysctl."""

    name: str = Field(min_length=1, description="Sysctl name, e.g. net.ipv4.ip_unprivileged_port_start.")
    value: str = Field(description="Its value.")


class _SecurityContext(_Model):
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


class PodOverrides(_Model):
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


MOUNTED_BY_OPERATOR = ("is already mounted by the operator (/dev/shm, spec.snapshot.mountPath or the "
                       f"rdzvSecretName mount {C.RDZV_SECRET_MOUNT_PATH})")
UNKNOWN_VOLUME = (f"names no volume of the pod: add it to spec.podOverrides.volumes (the operator's own are "
                  f"{C.SHM_VOLUME}, {C.SNAPSHOT_VOLUME} with spec.snapshot and {C.RDZV_SECRET_VOLUME} with "
                  "rdzvSecretName)")


def _mount_rules() -> list[dict[str, str]]:
    """CEL twins of _mount_errors. Cost, as the API server estimates it (the largest input the
    schema allows): <= MAX_VOLUME_MOUNTS (64) mounts x (3 string comparisons of <= MAX_PATH
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


def _spec_rules() -> list[dict[str, str]]:
    """CEL twins of `_cross_field_errors` that span several spec fields."""
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
        cel(f"!({ep.format('nProcPerNode')}) || type(self.elasticPolicy.nProcPerNode) == int || "
            "self.elasticPolicy.nProcPerNode != 'gpu' || (has(self.resources) && "
            f"has(self.resources.limits) && '{GPU_RESOURCE}' in self.resources.limits)",
            f'spec.elasticPolicy.nProcPerNode "gpu" needs spec.resources.limits["{GPU_RESOURCE}"]'),
        cel("!has(self.env) || self.env.all(e, !(e.name in "
            + json.dumps(sorted(RESERVED_ENV)).replace('"', "'") + "))",
            "spec.env may not set variables the operator derives from the spec "
            "(PET_*, DDPJOB_*): use the spec field instead"),
    ] + _mount_rules()


class DDPJobSpec(_Model):
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
    def _defaults_and_rules(self, info: ValidationInfo) -> DDPJobSpec:
        _resolve_replica_defaults(self)
        context = info.context or {}
        errors = _cross_field_errors(self, context.get("invalid", ()))
        collector = context.get("collect_errors")
        if collector is not None:
            collector.extend(errors)
        elif errors:
            raise ValueError("; ".join(e.message for e in errors))
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


def _resolve_replica_defaults(spec: DDPJobSpec) -> None:
    # Written through __dict__ so model_fields_set keeps telling given fields from defaults.
    ep = spec.elastic_policy
    if ep.min_replicas is None:
        ep.__dict__["min_replicas"] = spec.replicas or 1
    if ep.max_replicas is None:
        ep.__dict__["max_replicas"] = max(ep.min_replicas, spec.replicas or 0)
    if spec.replicas is None:
        spec.__dict__["replicas"] = ep.min_replicas


# --- Errors ------------------------------------------------------------------

MISSING = object()  # FieldError.value of a field that is absent


def _show(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass(frozen=True)
class FieldError:
    """One broken rule: where, what was there, and what the rule says."""

    path: str  # e.g. "spec.elasticPolicy.maxReplicas"
    value: Any  # the offending value, or MISSING
    rule: str  # e.g. "must be >= spec.elasticPolicy.minReplicas (2)"

    @property
    def message(self) -> str:
        """'<path> (<value>) <rule>', e.g. 'spec.replicas (0) must be >= 1'."""
        if self.value is MISSING:
            return f"{self.path} {self.rule}"
        return f"{self.path} ({_show(self.value)}) {self.rule}"

    def __str__(self) -> str:
        return self.message


class InvalidSpecError(ValueError):
    """The spec breaks one or more rules; `errors` lists all of them."""

    def __init__(self, errors: list[FieldError]):
        self.errors = list(errors)
        super().__init__("invalid DDPJob: " + "; ".join(e.message for e in self.errors))


def _cross_field_errors(spec: DDPJobSpec, invalid: tuple[str, ...] = ()) -> list[FieldError]:
    """Rules that span fields; each has a CEL twin in the models' x-kubernetes-validations.

    A rule that reads a field in `invalid` (a path the field rules refused, now holding its
    default) is skipped: judged on the default it could report a problem the file does not have.
    """
    return [error for reads, rule in _CROSS_FIELD_RULES
            if not any(_overlaps(read, bad) for read in _reads(reads, spec) for bad in invalid)
            for error in rule(spec)]


def _reads(reads: Any, spec: DDPJobSpec) -> tuple[str, ...]:
    return reads(spec) if callable(reads) else reads


def _overlaps(read: str, bad: str) -> bool:
    """Whether path `bad` is `read`, inside it, or holds it (spec.env[2].name and spec.env)."""
    inner, outer = (bad, read) if len(bad) >= len(read) else (read, bad)
    return inner == outer or inner.startswith((outer + ".", outer + "["))


def _code_errors(spec: DDPJobSpec) -> list[FieldError]:
    if spec.module is None and spec.script is None:
        return [FieldError("spec.module", MISSING, "is required: set exactly one of spec.module or spec.script")]
    if spec.module is not None and spec.script is not None:
        return [FieldError("spec.script", spec.script, f"may not be set together with spec.module "
                           f"({_show(spec.module)}): set exactly one of them")]
    return []


def _range_errors(spec: DDPJobSpec) -> list[FieldError]:
    ep = spec.elastic_policy
    if ep.max_replicas < ep.min_replicas:
        return [FieldError("spec.elasticPolicy.maxReplicas", ep.max_replicas,
                           f"must be >= spec.elasticPolicy.minReplicas ({ep.min_replicas})")]
    return []


def _range_reads(spec: DDPJobSpec) -> tuple[str, ...]:
    """minReplicas and maxReplicas, and replicas too when either of them defaults from it."""
    return REPLICA_FIELDS[1:] if _given(spec, "min_replicas", "max_replicas") else REPLICA_FIELDS


def _given(spec: DDPJobSpec, *names: str) -> bool:
    """Whether the file set these elasticPolicy fields (else they hold defaults taken from others)."""
    return set(names) <= spec.elastic_policy.model_fields_set


def _below_min_errors(spec: DDPJobSpec) -> list[FieldError]:
    ep = spec.elastic_policy
    if "replicas" in spec.model_fields_set and spec.replicas < ep.min_replicas:  # a defaulted one repeats min/max
        return [FieldError("spec.replicas", spec.replicas,
                           f"must be >= spec.elasticPolicy.minReplicas ({ep.min_replicas})")]
    return []


def _above_max_errors(spec: DDPJobSpec) -> list[FieldError]:
    ep = spec.elastic_policy
    if "replicas" in spec.model_fields_set and spec.replicas > ep.max_replicas:
        return [FieldError("spec.replicas", spec.replicas,
                           f"must be <= spec.elasticPolicy.maxReplicas ({ep.max_replicas})")]
    return []


def _gpu_errors(spec: DDPJobSpec) -> list[FieldError]:
    if spec.elastic_policy.n_proc_per_node == "gpu" and GPU_RESOURCE not in spec.resources.limits:
        return [FieldError("spec.elasticPolicy.nProcPerNode", "gpu",
                           f'needs spec.resources.limits["{GPU_RESOURCE}"] (a GPU limit)')]
    return []


def _backoff_errors(spec: DDPJobSpec) -> list[FieldError]:
    fp = spec.failure_policy
    if fp.max_backoff_seconds < fp.backoff_seconds:
        return [FieldError("spec.failurePolicy.maxBackoffSeconds", fp.max_backoff_seconds,
                           f"must be >= spec.failurePolicy.backoffSeconds ({fp.backoff_seconds})")]
    return []


REPLICA_FIELDS = ("spec.replicas", "spec.elasticPolicy.minReplicas", "spec.elasticPolicy.maxReplicas")
# Each cross-field rule with the paths it reads, or a function of the spec giving them (a
# defaulted replica field reads the other two).
_CROSS_FIELD_RULES = (
    (("spec.module", "spec.script"), _code_errors),
    (_range_reads, _range_errors),
    (REPLICA_FIELDS[:2], _below_min_errors),
    # maxReplicas defaults to max(minReplicas, replicas)
    (lambda spec: REPLICA_FIELDS[::2] if _given(spec, "max_replicas") else REPLICA_FIELDS, _above_max_errors),
    (("spec.elasticPolicy.rdzvStore", "spec.elasticPolicy.rdzvBackend", "spec.elasticPolicy.rdzvSecretName",
      "spec.elasticPolicy.managedEtcd", "spec.elasticPolicy.rdzvEndpoints"),
     lambda spec: _rdzv_errors(spec.elastic_policy)),
    (("spec.elasticPolicy.nProcPerNode", "spec.resources"), _gpu_errors),
    (("spec.failurePolicy.backoffSeconds", "spec.failurePolicy.maxBackoffSeconds"), _backoff_errors),
    (("spec.resources",), lambda spec: _resource_errors(spec.resources)),
    (("spec.env",), lambda spec: _env_errors(spec)),
    # volumeMounts are checked against the operator's mounts: the snapshot's and the rdzv secret's
    (("spec.podOverrides", "spec.snapshot", "spec.elasticPolicy.rdzvSecretName", "spec.scheduling.nodeSelector"),
     lambda spec: _override_errors(spec)),
    (("spec.podOverrides",), lambda spec: _security_errors(spec.pod_overrides)),
)


def _rdzv_errors(ep: ElasticPolicy) -> list[FieldError]:
    if ep.rdzv_store == "pod" and ep.rdzv_backend != "c10d":
        return [FieldError("spec.elasticPolicy.rdzvStore", ep.rdzv_store,
                           f"may be pod only when rdzvBackend is c10d, not {ep.rdzv_backend} (etcd "
                           "backends keep their state in etcd): remove it or set rdzvBackend to c10d")]
    if ep.rdzv_secret_name is not None and ep.rdzv_backend not in ETCD_BACKENDS:
        return [FieldError("spec.elasticPolicy.rdzvSecretName", ep.rdzv_secret_name,
                           "may only be set when rdzvBackend is etcd or etcd-v3 (c10d has no etcd to "
                           "authenticate to): remove it or change rdzvBackend")]
    if ep.managed_etcd.enabled:
        return _managed_etcd_errors(ep)
    path = "spec.elasticPolicy.rdzvEndpoints"
    if ep.rdzv_backend in ETCD_BACKENDS and not ep.rdzv_endpoints:
        return [FieldError(path, ep.rdzv_endpoints,
                           f"must list at least one etcd host:port when rdzvBackend is {ep.rdzv_backend} "
                           "(or set managedEtcd.enabled: true)")]
    if ep.rdzv_backend == "c10d" and ep.rdzv_endpoints:
        return [FieldError(path, ep.rdzv_endpoints,
                           "must be empty when rdzvBackend is c10d "
                           "(the operator points every node at the job's c10d store: its <job>-rdzv pod, or node 0 with rdzvStore: node)")]
    if ep.rdzv_backend == "etcd" and len(ep.rdzv_endpoints) > 1:
        return [FieldError(path, ep.rdzv_endpoints,
                           "must have exactly one entry when rdzvBackend is etcd "
                           "(torch's v2 backend takes one endpoint; etcd-v3 takes several)")]
    return []


def _managed_etcd_errors(ep: ElasticPolicy) -> list[FieldError]:
    path = "spec.elasticPolicy.managedEtcd.enabled"
    if ep.rdzv_backend not in ETCD_BACKENDS:
        return [FieldError(path, True, f"needs rdzvBackend etcd or etcd-v3, not {ep.rdzv_backend}: "
                           "set rdzvBackend or remove managedEtcd")]
    if ep.rdzv_endpoints:
        return [FieldError("spec.elasticPolicy.rdzvEndpoints", ep.rdzv_endpoints,
                           "must be empty when managedEtcd.enabled is true (the operator points the "
                           "nodes at its own etcd): remove one of them")]
    if ep.rdzv_secret_name is not None:
        return [FieldError("spec.elasticPolicy.rdzvSecretName", ep.rdzv_secret_name,
                           "may not be set when managedEtcd.enabled is true: the managed etcd has no "
                           "TLS or auth; use your own etcd with rdzvEndpoints for that")]
    return []


def _env_errors(spec: DDPJobSpec) -> list[FieldError]:
    errors = [
        FieldError(f"spec.env[{i}].name", e.name,
                   f"is set by the operator; use {RESERVED_ENV[e.name]} instead")
        for i, e in enumerate(spec.env) if e.name in RESERVED_ENV
    ]
    return errors + _duplicates("spec.env", "name", [e.name for e in spec.env])


def _duplicates(path: str, key: str, values: list[Any]) -> list[FieldError]:
    """Twin of a list map (list_map): each `key` once, as the API server requires."""
    first: dict[Any, int] = {}
    errors = []
    for i, value in enumerate(values):
        if value in first:
            errors.append(FieldError(f"{path}[{i}].{key}", value,
                                     f"repeats {path}[{first[value]}].{key}: each {key} may appear once"))
        first.setdefault(value, i)
    return errors


def _string_rule(value: Any, pattern: str, max_length: int) -> str | None:
    """Why `value` breaks a string field's schema, in _from_pydantic's words; None when it fits."""
    if not isinstance(value, str):
        return "must be a string"
    if len(value) > max_length:
        return f"must be at most {max_length} characters"
    if not re.match(pattern, value):
        return PATTERN_RULES[pattern]
    return None


def _declared_errors(path: str, item: Mapping[str, Any], schema: Mapping[str, Any]) -> list[FieldError]:
    """Twin of the declared properties of VOLUME_SCHEMA / MOUNT_SCHEMA for one list entry."""
    errors = []
    for name, prop in schema["properties"].items():
        if "pattern" not in prop:  # declared for a rule to see (hostPath), not a string to check
            continue
        if name not in item:
            if name in schema["required"]:
                errors.append(FieldError(f"{path}.{name}", MISSING, "is required"))
            continue
        rule = _string_rule(item[name], prop["pattern"], prop["maxLength"])
        if rule:
            errors.append(FieldError(f"{path}.{name}", item[name], rule))
    return errors


def _override_errors(spec: DDPJobSpec) -> list[FieldError]:
    po, errors = spec.pod_overrides, []
    for key in po.labels:
        if key in RESERVED_LABELS:
            errors.append(FieldError(f"spec.podOverrides.labels[{key!r}]", po.labels[key],
                                     "may not be set: the operator selects its pods by this label"))
    for i, vol in enumerate(po.volumes):
        errors += _declared_errors(f"spec.podOverrides.volumes[{i}]", vol, VOLUME_SCHEMA)
        if vol.get("name") in RESERVED_VOLUMES:
            errors.append(FieldError(f"spec.podOverrides.volumes[{i}].name", vol.get("name"),
                                     f"is used by the operator; pick a name other than {', '.join(RESERVED_VOLUMES)}"))
    errors += _duplicates("spec.podOverrides.volumes", "name", [_key(v.get("name")) for v in po.volumes])
    return errors + _mount_errors(spec) + _key_errors(spec) + _privilege_errors(po)


def _privilege_errors(po: PodOverrides) -> list[FieldError]:
    """What podOverrides may not change (docs/security.md): the host's privileges, the node's files,
    and Kueue's admission labels. Twins of the CEL rules on ContainerSecurityContext, Capabilities,
    VOLUME_SCHEMA and the labels and annotations maps."""
    box, base = po.container_security_context, "spec.podOverrides.containerSecurityContext"
    errors = [FieldError(f"spec.podOverrides.labels[{k!r}]", v, KUEUE_RULE)
              for k, v in po.labels.items() if k in RESERVED_KUEUE_LABELS]
    errors += [FieldError(f"spec.podOverrides.annotations[{k!r}]", v, KUEUE_RULE)
               for k, v in po.annotations.items() if k in RESERVED_KUEUE_ANNOTATIONS]
    if box.privileged:
        errors.append(FieldError(f"{base}.privileged", True, PRIVILEGED_RULE))
    if box.allow_privilege_escalation:
        errors.append(FieldError(f"{base}.allowPrivilegeEscalation", True, ESCALATION_RULE))
    added = (box.capabilities.add if box.capabilities else None) or []
    errors += [FieldError(f"{base}.capabilities.add[{i}]", c, CAPABILITY_RULE)
               for i, c in enumerate(added) if c not in SAFE_CAPABILITIES]
    return errors + [FieldError(f"spec.podOverrides.volumes[{i}].hostPath", v["hostPath"], HOST_PATH_RULE)
                     for i, v in enumerate(po.volumes) if "hostPath" in v]


def _key(value: Any) -> Any:
    """A list-map key value, hashable whatever the input (a broken entry is reported elsewhere)."""
    return value if isinstance(value, (str, int, float, bool, type(None))) else json.dumps(value, default=str)


def _operator_mounts(spec: DDPJobSpec) -> dict[str, str]:
    """Volume name -> mount path of the operator's own mounts in the trainer container."""
    mounts = {C.SHM_VOLUME: C.SHM_MOUNT_PATH}
    if spec.snapshot:
        mounts[C.SNAPSHOT_VOLUME] = spec.snapshot.mount_path
    if spec.elastic_policy.rdzv_secret_name:
        mounts[C.RDZV_SECRET_VOLUME] = C.RDZV_SECRET_MOUNT_PATH
    return mounts


def _mount_errors(spec: DDPJobSpec) -> list[FieldError]:
    """Twins of MOUNT_SCHEMA and of the two volumeMounts rules in _spec_rules."""
    po, ours, errors = spec.pod_overrides, _operator_mounts(spec), []
    volumes = set(ours) | {v.get("name") for v in po.volumes if isinstance(v.get("name"), str)}
    for i, mount in enumerate(po.volume_mounts):
        path = f"spec.podOverrides.volumeMounts[{i}]"
        broken = _declared_errors(path, mount, MOUNT_SCHEMA)
        errors += broken
        if broken:
            continue
        if mount["mountPath"] in ours.values():
            errors.append(FieldError(f"{path}.mountPath", mount["mountPath"], MOUNTED_BY_OPERATOR))
        if mount["name"] not in volumes:
            errors.append(FieldError(f"{path}.name", mount["name"], UNKNOWN_VOLUME))
    return errors + _duplicates("spec.podOverrides.volumeMounts", "mountPath",
                                [_key(m.get("mountPath")) for m in po.volume_mounts])


def qualified_name_problem(key: str) -> str | None:
    """Why `key` is not a Kubernetes label or annotation key (apimachinery's IsQualifiedName)."""
    prefix, slash, name = key.rpartition("/")
    if (len(name) > 63 or not re.fullmatch(QUALIFIED_NAME, name)
            or (slash and (len(prefix) > 253 or not re.fullmatch(DNS_SUBDOMAIN, prefix)))):
        return ("must be a qualified name: at most 63 letters, digits, '-', '_' and '.', starting and "
                "ending with a letter or digit, optionally after a DNS subdomain and '/' (example.com/team)")
    return None


ANNOTATIONS_LIMIT = 256 * 1024  # the API server's limit on an object's annotations, keys and values


def _key_errors(spec: DDPJobSpec) -> list[FieldError]:
    """Label, annotation and nodeSelector keys (the CRD checks only the values: see LabelValue)."""
    maps = {"spec.podOverrides.labels": spec.pod_overrides.labels,
            "spec.podOverrides.annotations": spec.pod_overrides.annotations,
            "spec.scheduling.nodeSelector": spec.scheduling.node_selector}
    errors = [FieldError(f"{path} key", key, qualified_name_problem(key))
              for path, keys in maps.items() for key in keys if qualified_name_problem(key)]
    size = sum(len(k.encode()) + len(v.encode()) for k, v in spec.pod_overrides.annotations.items())
    if size > ANNOTATIONS_LIMIT:
        errors.append(FieldError("spec.podOverrides.annotations", f"{size} bytes", (
            f"must total at most {ANNOTATIONS_LIMIT} bytes of keys and values (256 KiB, the API "
            "server's limit on a pod's annotations)")))
    return errors


def _security_errors(po: PodOverrides) -> list[FieldError]:
    """uid 0 with runAsNonRoot true (the default) never starts: the kubelet refuses the container
    (CreateContainerConfigError) and the pod waits forever. A pod-level uid 0 needs a pod-level
    runAsNonRoot: false, since the rendezvous store pod takes the pod level only."""
    pod, box = po.security_context, po.container_security_context
    if pod.run_as_user == 0 and pod.run_as_non_root is not False:
        return [_root_error("securityContext")]
    uid = pod.run_as_user if box.run_as_user is None else box.run_as_user
    non_root = pod.run_as_non_root if box.run_as_non_root is None else box.run_as_non_root
    return [_root_error("containerSecurityContext")] if uid == 0 and non_root is not False else []


def _root_error(context: str) -> FieldError:
    return FieldError(f"spec.podOverrides.{context}.runAsUser", 0,
                      "is root, which runAsNonRoot: true (the default) forbids, so the kubelet would never "
                      f"start the container: also set spec.podOverrides.{context}.runAsNonRoot: false")


STANDARD_RESOURCES = ("cpu", "memory", "ephemeral-storage")  # besides hugepages-<size> and extended ones
def _resource_errors(res: Resources) -> list[FieldError]:
    """Resource names the kubelet knows, and each request within its limit (the API server
    checks both only when it creates the pod; the CRD cannot compare quantities)."""
    errors = []
    for kind, values in (("limits", res.limits), ("requests", res.requests)):
        errors += [FieldError(f"spec.resources.{kind} key", name, (
            "must be cpu, memory, ephemeral-storage, hugepages-<size> or an extended resource with a "
            "domain such as nvidia.com/gpu")) for name in values if not _known_resource(name)]
    for name, request in res.requests.items():
        if name in res.limits and parse_quantity(request) > parse_quantity(res.limits[name]):
            errors.append(FieldError(f"spec.resources.requests.{name}", request,
                                     f"must be <= spec.resources.limits.{name} ({_show(res.limits[name])})"))
    return errors


def _known_resource(name: str) -> bool:
    return (name in STANDARD_RESOURCES or name.startswith("hugepages-")
            or ("/" in name and qualified_name_problem(name) is None))


def _pydantic_errors(exc: ValidationError) -> list[FieldError]:
    return [_from_pydantic(err) for err in exc.errors()]


def _loc_path(loc: tuple[Any, ...]) -> str:
    return "spec" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc)


def _from_pydantic(err: Mapping[str, Any]) -> FieldError:
    path = _loc_path(err["loc"])
    kind, ctx, value = err["type"], err.get("ctx") or {}, err.get("input", MISSING)
    if kind == "missing":
        return FieldError(path, MISSING, "is required")
    if kind == "extra_forbidden":
        return FieldError(path, value, unknown_field_rule(err["loc"]))
    rules = {
        "greater_than_equal": lambda: f"must be >= {ctx.get('ge')}",
        "less_than_equal": lambda: f"must be <= {ctx.get('le')}",
        "literal_error": lambda: f"must be one of {ctx.get('expected')}",
        "string_too_short": lambda: "must not be empty",
        "string_too_long": lambda: f"must be at most {ctx.get('max_length')} characters",
        "too_short": lambda: f"must have at least {ctx.get('min_length')} entries",
        "too_long": lambda: f"must have at most {ctx.get('max_length')} entries",
        "string_pattern_mismatch": lambda: PATTERN_RULES.get(ctx.get("pattern"), f"must match {ctx.get('pattern')}"),
        "value_error": lambda: str(ctx.get("error", err["msg"])),
        "int_type": lambda: "must be an integer",
        "string_type": lambda: "must be a string",
        "bool_type": lambda: "must be true or false",
        "list_type": lambda: "must be a list",
        "dict_type": lambda: "must be a mapping (an object)",
        "model_type": lambda: "must be a mapping (an object)",
        "model_attributes_type": lambda: "must be a mapping (an object)",
    }
    rule = rules.get(kind, lambda: _lower_first(err["msg"]))()
    return FieldError(path, value, rule)


def unknown_field_rule(loc: tuple[Any, ...]) -> str:
    """The rule for an unknown field at `loc`, with the closest field of that object when one is close."""
    meant = meant_field(loc)
    if meant:
        return f"is not a field of this object: did you mean {meant!r}?"
    return "is not a field of this object (check the spelling)"


@functools.lru_cache(maxsize=256)  # asked twice per unknown field: for its message and for the rules it holds back
def meant_field(loc: tuple[Any, ...]) -> str | None:
    """The field of the same object an unknown field at `loc` most likely misspells (difflib), or None."""
    known, word = _field_names(DDPJobSpec, loc[:-1]), str(loc[-1])
    # difflib's ratio is at most 2*len(name)/(len(word)+len(name)): a word over 3 times the longest name
    # cannot reach the 0.6 cutoff, and indexing a huge key (a hostile 1 MB one: 0.3 s) would be wasted
    if not known or len(word) > 3 * max(map(len, known)):
        return None
    close = difflib.get_close_matches(word, known, n=1)
    return close[0] if close else None


def _field_names(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The field names (as written in YAML) of the object at `loc` inside `model`; [] if unknown."""
    for step in loc:
        if isinstance(step, int):  # a list entry: the model was already unwrapped from list[...]
            continue
        field = next((f for name, f in model.model_fields.items() if step in (f.alias, name)), None)
        inner = _model_in(field.annotation) if field else None
        if inner is None:
            return []
        model = inner
    return [f.alias or name for name, f in model.model_fields.items()]


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside an annotation such as `X | None` or `list[X]`."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((m for m in map(_model_in, get_args(annotation)) if m is not None), None)


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]


# --- Entry points ------------------------------------------------------------

def validate_spec(body_spec: Mapping[str, Any] | None) -> list[FieldError]:
    """All rule violations of a DDPJob `spec` (empty list: valid), in one list.

    Field errors come first. The cross-field rules then run on what remains once the refused
    fields are taken out (they fall back to their defaults), skipping each rule that reads a
    refused field, so one run reports every error it can report truthfully.
    """
    return _checked_spec(body_spec)[0]


# Stands in for a refused or missing spec.image while the other rules run; no rule reads it.
_IMAGE_STAND_IN = "image.invalid/stand-in"
_PRUNE_ROUNDS = 4  # a refused field's default is valid, so one round normally suffices


def _checked_spec(body_spec: Any) -> tuple[list[FieldError], DDPJobSpec | None, tuple[str, ...]]:
    """(every error, the spec the cross-field rules saw or None, the refused paths)."""
    try:
        collected: list[FieldError] = []
        spec = DDPJobSpec.model_validate(body_spec or {}, context={"collect_errors": collected})
        return collected, spec, ()
    except ValidationError as exc:
        field_errors, locs = _pydantic_errors(exc), [e["loc"] for e in exc.errors()]
        # a misspelt field leaves the one it meant at its default: what the file wants there is unknown
        meant = [loc[:-1] + (m,) for e, loc in zip(exc.errors(), locs)
                 if e["type"] == "extra_forbidden" and (m := meant_field(loc))]
    if not isinstance(body_spec, Mapping) or any(not loc for loc in locs):
        return field_errors, None, ()
    pruned, invalid = body_spec, tuple(_loc_path(loc) for loc in locs + meant)
    for _ in range(_PRUNE_ROUNDS):
        for loc in locs:
            pruned = _pruned(pruned, loc)
        pruned = {"image": _IMAGE_STAND_IN, **pruned}
        try:
            collected = []
            spec = DDPJobSpec.model_validate(pruned, context={"collect_errors": collected, "invalid": invalid})
            return field_errors + collected, spec, invalid
        except ValidationError as exc:
            locs = [e["loc"] for e in exc.errors()]
            invalid += tuple(_loc_path(loc) for loc in locs)
    return field_errors, None, invalid


def _pruned(body: Mapping[str, Any], loc: tuple[Any, ...]) -> dict[str, Any]:
    """`body` without the refused value at `loc`: the field holding it, or the whole list it is an entry of
    (removing one entry would renumber the others, and their errors would name wrong paths). Copies only
    the objects on the way down; the rest is shared, never changed."""
    keys = loc[:next((i for i, step in enumerate(loc) if isinstance(step, int)), len(loc))]
    copied, child = dict(body), body.get(keys[0]) if keys else None
    if len(keys) > 1 and isinstance(child, Mapping) and keys[1] in child:
        copied[keys[0]] = _pruned(child, keys[1:])
    elif keys:
        copied.pop(keys[0], None)  # absent (a missing field): nothing to take out
    return copied


def parse_spec(body_spec: Mapping[str, Any] | None) -> DDPJobSpec:
    """Typed, defaulted spec.

    Raises:
        InvalidSpecError: carrying every FieldError.
    """
    errors = validate_spec(body_spec)
    if errors:
        raise InvalidSpecError(errors)
    return DDPJobSpec.model_validate(body_spec or {})


@dataclass(frozen=True)
class JobRef:
    """Identity of a DDPJob object: what names, labels and ownerReferences need."""

    name: str
    namespace: str = "default"
    uid: str = ""
    generation: int = 0
    created: str | None = None  # metadata.creationTimestamp: snapshots older than it are an earlier job's

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> JobRef:
        meta = body.get("metadata") or {}
        return cls(name=meta.get("name", ""), namespace=meta.get("namespace") or "default",
                   uid=meta.get("uid", ""), generation=int(meta.get("generation") or 0),
                   created=meta.get("creationTimestamp"))


def validate_job(body: Any) -> list[FieldError]:
    """Every broken rule of a DDPJob object: its size and nesting, apiVersion, kind, metadata
    (the job name) and spec. A document too large or too deep is reported alone: the other
    rules would walk (or, for a YAML alias bomb, expand) all of it."""
    return checked_job(body)[0]


def checked_job(body: Any) -> tuple[list[FieldError], DDPJobSpec | None]:
    """validate_job's errors, and the typed spec when there are none (else None): the spec is
    parsed once, for the check and for the caller (a reconcile pass)."""
    if not isinstance(body, Mapping):
        return [FieldError("DDPJob", body, "must be a mapping (an object) with apiVersion, kind, metadata and spec")], None
    shape = document_errors(body)
    if shape:
        return shape, None
    errors = _identity_errors(body)
    spec_errors, spec, invalid = _checked_spec(body.get("spec"))
    if not any(e.path.startswith("metadata") for e in errors):
        name = body["metadata"]["name"]
        # With a refused replica field maxReplicas is unknown: 1 is the bound every job name must fit.
        known = spec is not None and not any(_overlaps(f, bad) for f in REPLICA_FIELDS for bad in invalid)
        problem = name_too_long(name, spec.max_replicas if known else 1)
        if problem:
            errors.append(FieldError("metadata.name", name, problem))
    errors += spec_errors
    return errors, spec if not errors else None


def _identity_errors(body: Mapping[str, Any]) -> list[FieldError]:
    """apiVersion and kind (the API server routes by them, so no schema of ours sees a wrong
    one: kubectl says "no matches for kind") and metadata.name."""
    errors = [FieldError(field, body.get(field, MISSING), f"must be {wanted}")
              for field, wanted in (("apiVersion", C.API_VERSION), ("kind", C.KIND)) if body.get(field) != wanted]
    meta = body.get("metadata")
    meta = {} if meta is None else meta
    if not isinstance(meta, Mapping):
        return errors + [FieldError("metadata", meta, "must be a mapping (an object) with the job's name")]
    name = meta.get("name", MISSING)
    if name is MISSING:
        return errors + [FieldError("metadata.name", MISSING, "is required")]
    if not isinstance(name, str) or not re.match(JOB_NAME_PATTERN, name):
        errors.append(FieldError("metadata.name", name, JOB_NAME_RULE))
    return errors


def document_errors(body: Any) -> list[FieldError]:
    """Nesting deeper than MAX_DEPTH, or more than OBJECT_SIZE_LIMIT bytes as compact JSON.

    One walk with an explicit stack: no recursion to overflow, and it stops at the first limit,
    so a YAML alias cycle or an alias bomb (small text, huge expansion) costs no more than a
    document of the limit's size.
    """
    size, stack = 0, [(body, ())]
    while stack:
        value, path = stack.pop()
        if len(path) > MAX_DEPTH:
            return [FieldError(_path_text(path[:6]) + "...", MISSING, (
                f"is nested more than {MAX_DEPTH} levels deep: no DDPJob field is deeper than 12, so the "
                "document is broken"))]
        if isinstance(value, Mapping):
            size += 2 + len(value) + max(len(value) - 1, 0)  # braces, colons and commas
            size += sum(len(json.dumps(str(k), ensure_ascii=False).encode()) for k in value)
            stack += [(v, path + (str(k),)) for k, v in value.items()]
        elif isinstance(value, list):
            size += 2 + max(len(value) - 1, 0)  # brackets and commas
            stack += [(v, path + (i,)) for i, v in enumerate(value)]
        else:
            size += len(json.dumps(value, ensure_ascii=False, default=str).encode())
        if size > OBJECT_SIZE_LIMIT:
            return [FieldError("DDPJob", MISSING, (
                f"is over {OBJECT_SIZE_LIMIT} bytes (1.5 MiB) as JSON, etcd's default request limit: the "
                "API server cannot store it (keep large data in a ConfigMap, a volume or the image)"))]
    return []


def _path_text(path: tuple[Any, ...]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else p) for i, p in enumerate(path))


def parse_job(body: Mapping[str, Any]) -> tuple[JobRef, DDPJobSpec]:
    """JobRef and typed spec of a DDPJob body.

    Raises:
        InvalidSpecError: carrying every FieldError of spec and metadata.
    """
    errors = validate_job(body)
    if errors:
        raise InvalidSpecError(errors)
    return JobRef.from_body(body), DDPJobSpec.model_validate(body.get("spec") or {})



# --- Status (the schema of .status; status.py computes it) ----------------------
# Every string and list is bounded (constants "What a pod or the cluster can grow in the status"):
# the API server refuses a longer one, and decide/bounds.py cuts the status to these same bounds
# before it is written.

Name = Annotated[str, Field(max_length=C.MAX_NAME_CHARS)]
PodName = Annotated[str, Field(max_length=C.MAX_POD_NAME_CHARS)]
Uid = Annotated[str, Field(max_length=C.MAX_UID_CHARS)]
Word = Annotated[str, Field(max_length=C.MAX_WORD_CHARS)]
Time = Annotated[str, Field(max_length=C.MAX_TIME_CHARS, json_schema_extra={"format": "date-time"})]

class Condition(_Model):
    """A Kubernetes-style condition."""

    type: Word = Field(description=("Running, Restarting, Succeeded, Failed, Suspended, InvalidSpec, "
                                   "NodesUnschedulable or PodCreateFailed."))
    status: Literal["True", "False", "Unknown"] = Field(description="Whether the condition holds.")
    reason: Word = Field("", description="CamelCase reason of the last transition.")
    message: str = Field("", max_length=C.MAX_CONDITION_MESSAGE_CHARS, description="Human-readable details.")
    last_transition_time: Time | None = Field(None, description="When status last changed.")


class LastSnapshot(_Model):
    """The newest complete snapshot, from <snapshot dir>/progress.json."""

    epoch: int | None = Field(None, description="Epoch of the snapshot.")
    step: int | None = Field(None, description="Global optimizer step of the snapshot.")
    time: Time | None = Field(None, description="When it was written.")
    path: str | None = Field(None, max_length=C.MAX_SNAPSHOT_PATH_CHARS, description=(
        "Where it is, inside the snapshot volume."))


class TrainingProgress(_Model):
    """Live training figures from the nodes' heartbeats (the progress endpoint; docs/hangs.md)."""

    step: int | None = Field(None, description="The highest training step any node reported.")
    step_seconds: float | None = Field(None, description="Median recent step time over the nodes.")
    advanced_time: Time | None = Field(None, description=(
        "When the operator saw the step advance (or this run start): the hang clock runs from here."))
    run: Word | None = Field(None, description="Start time of the run polled (a new run restarts the hang clock).")
    hang_timeout_seconds: float | None = Field(None, description="The hang timeout in force (0: off).")
    slowest_node: Word | None = Field(None, description="Node index of the slowest node.")
    slowdown: float | None = Field(None, description=(
        "Step time of the group over what it would be if the slowest node kept pace with the median node."))
    slow_since: Time | None = Field(None, description="Since when slowestNode has been over stragglerPolicy.threshold.")
    reported_straggler: Word | None = Field(None, description=(
        "The slow node last reported in a Straggler Event (one Event per slow spell)."))


class InvalidProgressRecord(_Model):
    """A refused progress record (status.invalidProgressRecords): the pod, the field, and when it was reported."""

    pod: PodName | None = Field(None, description="Pod name.")
    pod_uid: Uid | None = Field(None, alias="podUID", description="Pod uid.")
    field: str | None = Field(None, max_length=C.MAX_RECORD_FIELD_CHARS, description=(
        "The record's field that broke the contract, e.g. snapshot.step (an unknown key is cut short)."))
    time: Time | None = Field(None, description=(
        "When it was reported in a Warning Event (a pod's endpoint gets at most one a minute)."))


class NodeFailure(_Model):
    """One failed or disrupted node pod, explained (status.failures)."""

    index: int | None = Field(None, description="Node index of the pod.")
    pod: PodName | None = Field(None, description="Pod name.")
    pod_uid: Uid | None = Field(None, alias="podUID", description="Pod uid (each pod is listed once).")
    node: Name | None = Field(None, description=(
        "The Kubernetes node the pod ran on (absent when it was never scheduled); see status.avoidedNodes."))
    cause: Literal["Error", "OOMKilled", "PermanentExitCode", "DoNotRetry", "Disrupted", "NodeLost", "Deleted",
                   "ImagePull", "Hang", "Straggler", "PreflightFailed"] | None = Field(
        None, description=("Error, OOMKilled, PermanentExitCode, DoNotRetry (these count against the budget; the "
                           "last two fail the job: a permanent exit code, or the trainer raised DoNotRetry, whose "
                           "reason is in `reason`), Disrupted, NodeLost or Deleted (deleted by someone while it "
                           "trained, without a DisruptionTarget; all three free), ImagePull, Hang (no step for "
                           "failurePolicy.hangTimeoutSeconds: the group restarted, charged by the progress rule), "
                           "Straggler (a slow node replaced under stragglerPolicy.action Replace; free), "
                           "PreflightFailed (spec.preflight)."))
    step: int | None = Field(None, description="Hang: the last training step reached.")
    stalled_nodes: list[Word] = Field(default_factory=list, max_length=C.MAX_STALLED_NODES, description=(
        "Hang: the node indexes whose progress stopped first (every node when all stopped together; "
        f"at most {C.MAX_STALLED_NODES})."))
    exit_code: int | None = Field(None, description="Exit code of torchrun, when it ran.")
    reason: Word | None = Field(None, description=(
        "The most specific reason: the DisruptionTarget condition's, the pod's or the container's."))
    message: str | None = Field(None, max_length=C.MAX_FAILURE_MESSAGE_CHARS, description=(
        "The trainer's error from its progress record, else the end of its log when "
        "failurePolicy.includeLogTail is true, shortened."))
    time: Time | None = Field(None, description="When the container finished (or the failure was seen).")


class AvoidedNode(_Model):
    """A node the job's new pods keep off (status.avoidedNodes, docs/cluster.md)."""

    node: Name | None = Field(None, description="The Kubernetes node's name (its kubernetes.io/hostname label).")
    cause: Word | None = Field(None, description=(
        "NodeLost or Straggler (one failure), RepeatedFailures (two pods on it exited with Error or "
        "OOMKilled while no other node failed)."))
    since: Time | None = Field(None, description="When the failure that put it here happened.")


class SnapshotMark(_Model):
    """The snapshot the restart budget compares with."""

    step: int | None = Field(None, description="Global step of status.lastSnapshot at the last failure incident.")
    time: Time | None = Field(None, description="Its completion time.")


class LastResume(_Model):
    """The newest run of the trainer the operator heard of."""

    time: Time | None = Field(None, description="When its workers started.")
    first_step_time: Time | None = Field(None, description="When it completed its first optimizer step.")
    from_step: int | None = Field(None, description="The snapshot step it resumed from; null: from scratch.")


class Recovery(_Model):
    """Figures from the trainer's progress records (polled from running pods and read when a container exits)."""

    last_recovery_seconds: float | None = Field(None, description=(
        "Time to recover from the latest failure incident: lastFailureTime to the first step after it."))
    recovered_failure_time: Time | None = Field(None, description="The incident lastRecoverySeconds is about.")
    lost_seconds: float | None = Field(None, description=(
        "Training time lost so far to restarts (failures and membership changes): for each run after the "
        "first, from the snapshot it resumed from (or the job's start) to its first step. Runs not reported "
        "yet are missing until a container exits."))
    startup_seconds: float | None = Field(None, description=(
        "Start-up of the job's first run: from the job's start to its first step; not counted in lostSeconds."))
    resumed_from_earlier_job: LastResume | None = Field(None, description=(
        "Set once when the job's first run resumed from a snapshot written before the job was created: "
        "an earlier job's, left on the same snapshot volume (a ResumedFromEarlierJob Event says so). "
        "time is that snapshot's completion time."))
    last_resume: LastResume | None = Field(None, description="The newest run seen.")
    accounted_restarts: int | None = Field(None, description="Incidents already judged for progress (bookkeeping).")
    snapshot_at_last_failure: SnapshotMark | None = Field(None, description=(
        "status.lastSnapshot when the last incident was judged; a newer one means progress."))


class WorkerRestarts(_Model):
    """One node pod's torchrun restart count (status.workerRestartsByPod)."""

    pod: PodName | None = Field(None, description="Pod name.")
    pod_uid: Uid | None = Field(None, alias="podUID", description="Pod uid.")
    count: int | None = Field(None, description="TORCHELASTIC_RESTART_COUNT of its newest run of the workers.")


class Finishing(_Model):
    """The end of training (status.finishing): a node pod exited 0 while others still ran."""

    since: Time | None = Field(None, description="When the first node pod exited 0.")
    stopped: int | None = Field(None, description=(
        "Node pods still running 15 s after that, stopped by the operator (they would wait in "
        "torchrun's exit barrier)."))


class LastValid(_Model):
    """The newest valid spec (status.lastValid): what a job runs with after an invalid edit."""

    generation: int | None = Field(None, description="metadata.generation of that spec.")
    spec: KubeObject = Field(default_factory=dict, description=(
        "The spec as it was then; not kept when its JSON is over 64 KiB."))


class DDPJobStatus(_Model):
    """Observed state of a DDPJob, written by the operator."""

    phase: Literal["Pending", "Running", "Restarting", "Succeeded", "Failed", "Suspended"] | None = Field(
        None, description="Pending, Running, Restarting, Succeeded, Failed or Suspended.")
    conditions: list[Condition] = Field(default_factory=list, max_length=C.MAX_CONDITIONS,
                                        description="Current conditions.")
    replicas: int | None = Field(None, description="Node pods that exist and have not finished.")
    ready_replicas: int | None = Field(None, description="Node pods that are running and Ready.")
    ready: Word | None = Field(None, description="readyReplicas/spec.replicas, for kubectl get.")
    replica_range: Word | None = Field(None, description=(
        "spec.elasticPolicy minReplicas:maxReplicas, for kubectl get -o wide."))
    selector: str | None = Field(None, max_length=C.MAX_SELECTOR_CHARS, description=(
        "Label selector of the node pods (scale subresource)."))
    restarts: int | None = Field(None, description="Failure incidents recovered from (failurePolicy budget).")
    last_failure_time: Time | None = Field(None, description="Start of the latest failure incident.")
    handled_failures: list[Uid] = Field(default_factory=list, max_length=C.MAX_HANDLED_FAILURES, description=(
        "uids of failed pods already counted, so each failure is counted once."))
    last_snapshot: LastSnapshot | None = Field(None, description="The newest complete snapshot.")
    start_time: Time | None = Field(None, description="When the job (last) started.")
    completion_time: Time | None = Field(None, description="When the job finished.")
    observed_generation: int | None = Field(None, description="metadata.generation this status describes.")
    rendezvous_generation: int | None = Field(None, description=(
        "Whole-group restarts so far (losing the c10d store restarts every node); part of the "
        "rendezvous id (PET_RDZV_ID = <uid>-<generation> once it is above 0) and of the pods' "
        "ddpjob.io/rdzv-generation label, so an old rendezvous is never joined."))
    desired_replicas: int | None = Field(None, description="spec.replicas: node pods wanted.")
    scheduled_replicas: int | None = Field(None, description=(
        "Node pods of the current rendezvous generation bound to a Kubernetes node."))
    running_replicas: int | None = Field(None, description=(
        "Node pods of the current rendezvous generation whose phase is Running."))
    rendezvous_replicas: int | None = Field(None, description=(
        "Node pods of the current rendezvous generation that are Ready: the operator's estimate of "
        "the nodes in the rendezvous (it does not read the rendezvous store itself)."))
    unschedulable: list[Annotated[str, Field(max_length=C.MAX_UNSCHEDULABLE_CHARS)]] = Field(
        default_factory=list, max_length=C.MAX_UNSCHEDULABLE, description=(
            "Node pods the scheduler has not placed, each as '<pod>: <scheduler reason>: <message>' "
            f"(at most {C.MAX_UNSCHEDULABLE})."))
    restarts_with_progress: int | None = Field(None, description=(
        "Of status.restarts, incidents after which a newer snapshot was complete: not charged to "
        "failurePolicy.maxRestarts (which limits restarts - restartsWithProgress)."))
    restarts_without_progress: int | None = Field(None, description=(
        "Failure incidents in a row with no newer snapshot (failurePolicy.maxRestartsWithoutProgress)."))
    failures: list[NodeFailure] = Field(default_factory=list, max_length=C.MAX_FAILURES_KEPT, description=(
        f"The newest failed or disrupted node pods (at most {C.MAX_FAILURES_KEPT}), oldest first."))
    recovery: Recovery | None = Field(None, description="Time to recover, time lost, and budget bookkeeping.")
    progress: TrainingProgress | None = Field(None, description=(
        "Live step, step time and the slowest node, from the trainers' heartbeats."))
    avoided_nodes: list[AvoidedNode] = Field(default_factory=list, max_length=C.MAX_AVOIDED_NODES, description=(
        "Nodes that lost a pod to a node-caused failure: every node pod created afterwards carries a "
        f"required node anti-affinity to them, for the rest of the job; at most {C.MAX_AVOIDED_NODES}, oldest "
        "dropped first."))
    invalid_progress_records: list[InvalidProgressRecord] = Field(
        default_factory=list, max_length=C.MAX_RECORD_PROBLEMS_KEPT, description=(
            "Progress records the contract refused, one per pod and field, each reported once in an "
            "InvalidProgressRecord Warning Event; a pod's progress endpoint gets at most one a minute, a "
            "refusal past that is reported once the minute is over if still there. At most "
            f"{C.MAX_RECORD_PROBLEMS_KEPT}, newest kept, dropped with their pod."))
    worker_restarts: int | None = Field(None, description=(
        "torchrun's restarts of the workers inside node pods (elasticPolicy.maxRestarts: a worker failed, "
        "or a node joined or left), from the trainer's records; each counted once."))
    worker_restarts_by_pod: list[WorkerRestarts] = Field(default_factory=list, max_length=C.MAX_WORKER_RESTARTS_BY_POD,
                                                         description=(
        "The newest torchrun restart count of each observed node pod (bookkeeping of workerRestarts)."))
    finishing: Finishing | None = Field(None, description=(
        "The wait for node pods after training finished, and how many were stopped."))
    last_valid: LastValid | None = Field(None, description=(
        "The newest valid spec. After an edit the operator cannot accept (condition InvalidSpec) "
        "the job goes on with it: failed pods are replaced from it and its deadline holds."))
