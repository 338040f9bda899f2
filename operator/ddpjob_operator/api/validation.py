"""Whether a DDPJob is valid, and reading one: the Python twins of the CEL rules, pydantic's
errors in a person's words, and the entry points.

The API server runs the CRD's CEL rules at `kubectl apply`; each cross-field rule of the model
(spec.py) has a twin here, so a rule the API server could not run (old cluster, `kubectl apply
--validate=false`, local runs) is still enforced, reported as InvalidSpec. Every broken rule
becomes a FieldError naming the field, the value and the rule, and one run reports all of them.

Entry points: `validate_spec` and `validate_job` list the errors; `parse_spec` and `parse_job`
return the typed spec (and the job's JobRef) or raise InvalidSpecError with every error.
"""

from __future__ import annotations

import difflib
import functools
import json
import re
from dataclasses import dataclass
from typing import Any, Mapping, get_args

from pydantic import BaseModel, ValidationError

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.job_ref import JobRef
from ddpjob_operator.api.names import name_too_long
from ddpjob_operator.api.quantity import parse_quantity
from ddpjob_operator.api.spec import (
    ENV_NAME_PATTERN,
    ESCALATION_RULE,
    ETCD_BACKENDS,
    GPU_RESOURCE,
    HOST_PATH_RULE,
    IMAGE_PATTERN,
    JOB_NAME_PATTERN,
    JOB_NAME_RULE,
    LABEL_VALUE_PATTERN,
    MODULE_PATTERN,
    MOUNT_PATH_PATTERN,
    MOUNT_SCHEMA,
    PRIVILEGED_RULE,
    RESERVED_ENV,
    RESERVED_KUEUE_ANNOTATIONS,
    RESERVED_KUEUE_LABELS,
    RESERVED_LABELS,
    RESERVED_VOLUMES,
    SAFE_CAPABILITIES,
    SPARE_RULE,
    SECRET_NAME_PATTERN,
    VOLUME_NAME_PATTERN,
    VOLUME_SCHEMA,
    DDPJobSpec,
    ElasticPolicy,
    PodOverrides,
    Resources,
)

KUEUE_RULE = ("may not be set: Kueue admits pods by it, and the operator sets it from spec.scheduling.queueName "
              "(set there, it cannot join another job's pod group)")
CAPABILITY_RULE = ("is not a capability a job may add: only " + ", ".join(SAFE_CAPABILITIES)
                   + " (Pod Security baseline's, plus IPC_LOCK for RDMA)")
# A label or annotation key: an optional DNS-1123 subdomain prefix (<= 253) and '/', then a name
# of <= 63 characters; checked by qualified_name_problem (lengths included).
QUALIFIED_NAME = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
DNS_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"

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
    MOUNT_PATH_PATTERN: "must be a clean absolute path such as /data: no '.', '..' or empty segments and no trailing /",
    r"^/": "must be an absolute path (start with /)",
}

# The API server stores an object in one etcd request, and etcd refuses requests over its
# --max-request-bytes (1.5 MiB by default): a larger DDPJob fails at `kubectl apply` with
# "etcdserver: request is too large". (Client-side `kubectl apply` also copies the object into
# an annotation limited to 256 KiB; `kubectl create` and server-side apply do not.)
OBJECT_SIZE_LIMIT = 1536 * 1024
# No DDPJob field is nested deeper than 12 levels (spec.scheduling.affinity.podAntiAffinity...
# matchExpressions[].values[]); a deeper document is broken or hostile, and the operator's own
# copies of it (render, kopf) recurse. Checked without recursion, before anything else.
MAX_DEPTH = 32

MOUNTED_BY_OPERATOR = ("is already mounted by the operator (/dev/shm, spec.snapshot.mountPath or the "
                       f"rdzvSecretName mount {C.RDZV_SECRET_MOUNT_PATH})")
UNKNOWN_VOLUME = (f"names no volume of the pod: add it to spec.podOverrides.volumes (the operator's own are "
                  f"{C.SHM_VOLUME}, {C.SNAPSHOT_VOLUME} with spec.snapshot and {C.RDZV_SECRET_VOLUME} with "
                  "rdzvSecretName)")


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


def _spare_errors(spec: DDPJobSpec) -> list[FieldError]:
    """Twin of spec._spare_rule: spares wait only beside a full group."""
    if spec.spare_replicas and spec.desired_replicas != spec.max_replicas:
        return [FieldError("spec.elasticPolicy.spareReplicas", spec.spare_replicas, SPARE_RULE.replace(
            "spec.replicas must equal spec.elasticPolicy.maxReplicas",
            f"spec.replicas ({spec.desired_replicas}) must equal spec.elasticPolicy.maxReplicas ({spec.max_replicas})"))]
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
    (("spec.elasticPolicy.spareReplicas",) + REPLICA_FIELDS, _spare_errors),
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
    """Twin of a list map (spec.list_map): each `key` once, as the API server requires."""
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
    """Twins of MOUNT_SCHEMA and of the two volumeMounts rules in spec._mount_rules."""
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
    """Label, annotation and nodeSelector keys (the CRD checks only the values: see spec.LabelValue)."""
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
        spec = DDPJobSpec.model_validate(body_spec or {})
        return _cross_field_errors(spec), spec, ()
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
            spec = DDPJobSpec.model_validate(pruned)
            return field_errors + _cross_field_errors(spec, invalid), spec, invalid
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
        known = known and not any(_overlaps("spec.elasticPolicy.spareReplicas", bad) for bad in invalid)
        problem = name_too_long(name, spec.max_replicas + spec.spare_replicas if known else 1)
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

