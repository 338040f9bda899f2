"""The generated CRD: in sync with the model, structural, and rejecting what the model rejects.

Here: presence and text of the CEL rules; test_crd_cel.py runs them with cel-python.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from ddpjob_operator.api import constants as C
from ddpjob_operator.api import crd
from ddpjob_operator.api.validation import validate_spec
from ddpjob_sandbox.jobs import make_spec

ROOT = Path(__file__).resolve().parents[3]
GOLDEN = Path(__file__).parents[1] / "golden" / "crd.yaml"
CRD = crd.build_crd()
VERSION = CRD["spec"]["versions"][0]
SCHEMA = VERSION["schema"]["openAPIV3Schema"]
SPEC = SCHEMA["properties"]["spec"]


def walk(node, path="$"):
    """Every schema node with its JSON path."""
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from walk(child, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            yield from walk(node[key], f"{path}[{key}]")


def rules(node) -> list[dict]:
    return node.get("x-kubernetes-validations", [])


def test_checked_in_crd_files_match_the_model():
    assert crd.drifted_files(ROOT) == [], "run `make crd`"


def test_check_flag_reports_drift_with_exit_code_1(tmp_path, capsys):
    assert crd.main(["--root", str(tmp_path), "--check"]) == 1
    assert crd.main(["--root", str(tmp_path)]) == 0
    assert crd.main(["--root", str(tmp_path), "--check"]) == 0
    (tmp_path / crd.CRD_FILES[1]).write_text("stale")
    assert crd.main(["--root", str(tmp_path), "--check"]) == 1
    assert "is out of date with spec.py; run `make crd`" in capsys.readouterr().err


def test_crd_matches_golden_yaml():
    text = crd.render_crd_yaml()
    if os.environ.get("DDPJOB_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), "see tests/operator/golden/README.md to regenerate"


def test_crd_is_a_valid_apiextensions_v1_object():
    kubernetes_validate.validate(copy.deepcopy(CRD), "1.33", strict=True)


def test_names_scope_and_version_follow_the_contract():
    assert CRD["metadata"]["name"] == "ddpjobs.ddpjob.io"
    assert CRD["spec"]["names"] == {"kind": "DDPJob", "listKind": "DDPJobList", "plural": "ddpjobs",
                                    "singular": "ddpjob", "shortNames": ["ddpj"], "categories": ["all"]}
    assert (CRD["spec"]["scope"], VERSION["name"], VERSION["served"], VERSION["storage"]) == (
        "Namespaced", "v1alpha1", True, True)


def test_status_and_scale_subresources():
    assert VERSION["subresources"] == {"status": {}, "scale": {
        "specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector"}}


def test_printer_columns():
    assert [(c["name"], c["jsonPath"], c.get("priority", 0)) for c in VERSION["additionalPrinterColumns"]] == [
        ("Phase", ".status.phase", 0), ("Ready", ".status.ready", 0), ("Restarts", ".status.restarts", 0),
        ("Step", ".status.lastSnapshot.step", 0), ("Last Snapshot", ".status.lastSnapshot.time", 0),
        ("Age", ".metadata.creationTimestamp", 0),
        ("World Size", ".status.rendezvousReplicas", 1), ("Spares", ".status.spares", 1),
        ("Min:Max", ".status.replicaRange", 1),
        ("Rdzv Gen", ".status.rendezvousGeneration", 1), ("Worker Restarts", ".status.workerRestarts", 1),
        ("Free Restarts", ".status.restartsWithProgress", 1),
        ("Lost", ".status.recovery.lostSeconds", 1)]


def test_every_wide_column_reads_a_field_the_status_schema_declares():
    status = VERSION["schema"]["openAPIV3Schema"]["properties"]["status"]
    for column in VERSION["additionalPrinterColumns"]:
        path = column["jsonPath"].split(".")[1:]
        if path[0] != "status":
            continue
        schema = status
        for part in path[1:]:
            assert part in schema.get("properties", {}), f"{column['name']}: {column['jsonPath']}"
            schema = schema["properties"][part]


def test_schema_is_structural():
    for path, node in walk(SCHEMA):
        assert not {"$ref", "allOf", "oneOf", "not", "title", "nullable"} & node.keys(), path
        if "anyOf" in node:
            assert node.get("x-kubernetes-int-or-string") and node["anyOf"] == [
                {"type": "integer"}, {"type": "string"}], path
        elif not node.get("x-kubernetes-preserve-unknown-fields"):
            assert "type" in node, f"{path} has no type"
        if "properties" in node:
            assert "additionalProperties" not in node, path


def test_every_spec_field_has_a_description():
    missing = [p for p, n in walk(SPEC) if "description" not in n and not p.endswith("]")]
    assert missing == []


def test_int_or_string_fields_are_nproc_per_node_and_quantities():
    paths = [p for p, n in walk(SPEC) if n.get("x-kubernetes-int-or-string")]
    assert paths == ["$.resources.limits[additionalProperties]", "$.resources.requests[additionalProperties]",
                     "$.elasticPolicy.nProcPerNode"]


def test_kubernetes_objects_are_kept_as_given():
    props = SPEC["properties"]
    assert props["scheduling"]["properties"]["affinity"]["x-kubernetes-preserve-unknown-fields"] is True
    assert props["snapshot"]["properties"]["volume"]["x-kubernetes-preserve-unknown-fields"] is True
    assert SCHEMA["properties"]["status"]["x-kubernetes-preserve-unknown-fields"] is True  # kopf's keys


def test_defaults_reach_the_schema():
    ep = SPEC["properties"]["elasticPolicy"]
    assert ep["default"] == {}
    assert {k: ep["properties"][k].get("default") for k in ("nProcPerNode", "rdzvBackend", "rdzvPort")} == {
        "nProcPerNode": "auto", "rdzvBackend": "c10d", "rdzvPort": 29400}
    assert "default" not in SPEC["properties"]["replicas"]  # resolved from minReplicas by the model


IMMUTABLE = ["image", "module", "script", "elasticPolicy.rdzvBackend", "elasticPolicy.rdzvPort",
             "elasticPolicy.rdzvEndpoints"]


def test_exactly_the_chosen_fields_are_immutable_through_transition_rules():
    immutable = [p[2:] for p, n in walk(SPEC) if any(r["rule"] == "self == oldSelf" for r in rules(n))]
    assert immutable == IMMUTABLE
    # rdzvStore's rule sits on elasticPolicy: it compares the effective value (unset means pod).
    transitions = [r["message"] for r in rules(SPEC["properties"]["elasticPolicy"]) if "oldSelf" in r["rule"]]
    assert transitions == ["spec.elasticPolicy.rdzvStore is immutable: nodes of one job must share one "
                           "rendezvous (unset means pod)"]
    assert rules(SPEC["properties"]["image"]) == [{"rule": "self == oldSelf", "message": (
        "spec.image is immutable: all nodes of a DDP group must run the same code")}]
    # minReplicas and maxReplicas: one rule on the spec compares the ranges with their defaults
    # resolved (tests/operator/api/test_crd_cel.py runs it).
    assert [r["message"] for r in rules(SPEC) if "oldSelf" in r["rule"]] == [
        "spec.elasticPolicy minReplicas:maxReplicas may not change once the job exists: its torchrun agents were "
        "started with --nnodes minReplicas:maxReplicas (unset, both default to spec.replicas, so a job created "
        "without them keeps its size); delete and recreate the job to change them"]


def cross_field_messages() -> list[str]:
    return [r["message"] for _, n in walk(SCHEMA) for r in rules(n) if "oldSelf" not in r["rule"]]


def test_cross_field_cel_rules_are_present():
    assert cross_field_messages() == [
        "metadata.name must be a DNS-1035 label: lowercase letters, digits and hyphens, starting with a letter "
        "and ending with a letter or digit (it names the Service and the pods of the job)",
        "metadata.name is too long: pod names <name>-node-<index> must fit the 63-character DNS label limit",
        "exactly one of spec.module or spec.script must be set",
        "spec.replicas must be >= spec.elasticPolicy.minReplicas",
        "spec.replicas must be <= spec.elasticPolicy.maxReplicas",
        "spec.elasticPolicy.spareReplicas needs a full group: a spare waits outside the round only while the round "
        "holds maxReplicas nodes (below it, torchrun would admit the spare into the group), so spec.replicas must "
        "equal spec.elasticPolicy.maxReplicas",
        'spec.elasticPolicy.nProcPerNode "gpu" needs spec.resources.limits["nvidia.com/gpu"]',
        "spec.env may not set variables the operator derives from the spec (PET_*, DDPJOB_*): use the spec field instead",
        "spec.podOverrides.volumeMounts may not mount over /dev/shm, spec.snapshot.mountPath or the rdzvSecretName "
        "mount /etc/ddpjob/rdzv",
        "spec.podOverrides.volumeMounts must each name a volume of the pod: one of spec.podOverrides.volumes, dshm, "
        "snapshots (with spec.snapshot) or rdzv-credentials (with rdzvSecretName)",
        "spec.resources quantities must not be negative",
        "spec.resources quantities must not be negative",
        "spec.elasticPolicy.maxReplicas must be >= spec.elasticPolicy.minReplicas",
        "spec.elasticPolicy.rdzvEndpoints must list at least one etcd host:port when rdzvBackend is etcd or etcd-v3 (or set managedEtcd.enabled: true)",
        "spec.elasticPolicy.managedEtcd.enabled needs rdzvBackend etcd or etcd-v3, no rdzvEndpoints and no "
        "rdzvSecretName (the operator points the nodes at its own plaintext etcd)",
        "spec.elasticPolicy.rdzvEndpoints must be empty when rdzvBackend is c10d (the operator points every node at the job's c10d store: its <job>-rdzv pod, or node 0 with rdzvStore: node)",
        "spec.elasticPolicy.rdzvSecretName may only be set when rdzvBackend is etcd or etcd-v3 (c10d has no etcd to authenticate to): remove it or change rdzvBackend",
        "spec.elasticPolicy.rdzvStore may be pod only when rdzvBackend is c10d (etcd backends keep their state in etcd): remove it or set rdzvBackend to c10d",
        "spec.elasticPolicy.rdzvEndpoints must have exactly one entry when rdzvBackend is etcd (torch's v2 backend takes one endpoint; etcd-v3 takes several)",
        'spec.elasticPolicy.nProcPerNode must be an integer >= 1, "gpu" or "auto"',
        "spec.failurePolicy.maxBackoffSeconds must be >= spec.failurePolicy.backoffSeconds",
        "spec.podOverrides.labels may not set the labels the operator selects pods by",
        "spec.podOverrides.volumes may not use the volume names the operator adds (snapshots, dshm, rdzv-credentials, zygote)",
        "spec.podOverrides.containerSecurityContext.privileged may not be true: a privileged container holds every "
        "device and capability of its node",
        "spec.podOverrides.containerSecurityContext.allowPrivilegeEscalation may not be true: setuid and "
        "file-capability binaries would regain what the container dropped",
        "spec.podOverrides.containerSecurityContext.capabilities.add may add only AUDIT_WRITE, CHOWN, DAC_OVERRIDE, "
        "FOWNER, FSETID, IPC_LOCK, KILL, MKNOD, NET_BIND_SERVICE, SETFCAP, SETGID, SETPCAP, SETUID, SYS_CHROOT",
        "spec.podOverrides.volumes[].hostPath may not be set: a hostPath volume reaches the node's own files; use a "
        "PersistentVolumeClaim, an emptyDir or another volume type",
        "spec.podOverrides.labels may not set Kueue's kueue.x-k8s.io/queue-name, kueue.x-k8s.io/pod-group-name, "
        "kueue.x-k8s.io/prebuilt-workload-name: the operator sets them from spec.scheduling.queueName",
        "spec.podOverrides.annotations may not set Kueue's kueue.x-k8s.io/pod-group-total-count: the operator sets "
        "it from spec.replicas",
    ]


def test_reserved_env_label_and_volume_rules_name_every_reserved_key():
    from ddpjob_operator.api.spec import RESERVED_ENV, RESERVED_LABELS, RESERVED_VOLUMES
    (env_rule,) = [r["rule"] for r in rules(SPEC) if "self.env" in r["rule"]]
    label_rule, volume_rule = [r["rule"] for r in rules(SPEC["properties"]["podOverrides"])]
    assert all(f"'{name}'" in env_rule for name in RESERVED_ENV)
    assert all(f"'{key}' in self.labels" in label_rule for key in RESERVED_LABELS)
    assert all(f"'{name}'" in volume_rule for name in RESERVED_VOLUMES)


def test_every_list_and_string_a_cel_rule_walks_is_bounded():
    """The API server estimates a rule's cost from the largest input the schema allows: an
    unbounded list or string under a rule makes that estimate (and the CRD) fail to install."""
    props, overrides = SPEC["properties"], SPEC["properties"]["podOverrides"]["properties"]
    bounds = {"env": props["env"]["maxItems"], "env[].name": props["env"]["items"]["properties"]["name"]["maxLength"],
              "volumes": overrides["volumes"]["maxItems"], "volumeMounts": overrides["volumeMounts"]["maxItems"],
              "volumes[].name": overrides["volumes"]["items"]["properties"]["name"]["maxLength"],
              "volumeMounts[].mountPath": overrides["volumeMounts"]["items"]["properties"]["mountPath"]["maxLength"],
              "snapshot.mountPath": props["snapshot"]["properties"]["mountPath"]["maxLength"],
              "resources.limits": props["resources"]["properties"]["limits"]["maxProperties"]}
    add = overrides["containerSecurityContext"]["properties"]["capabilities"]["properties"]["add"]
    bounds.update({"capabilities.add": add["maxItems"], "capabilities.add[]": add["items"]["maxLength"]})
    assert bounds == {"env": 128, "env[].name": 253, "volumes": 64, "volumeMounts": 64, "volumes[].name": 63,
                      "volumeMounts[].mountPath": 4096, "snapshot.mountPath": 4096, "resources.limits": 32,
                      "capabilities.add": 32, "capabilities.add[]": 64}


def test_every_list_or_string_that_carries_a_rule_is_bounded():
    """A rule on a list or string (rdzvEndpoints' `self == oldSelf`) costs by its largest size."""
    unbounded = [path for path, node in walk(SCHEMA) if rules(node) and (
        (node.get("type") == "array" and "maxItems" not in node)
        or (node.get("type") == "string" and "maxLength" not in node and "enum" not in node))]
    assert unbounded == []
    endpoints = SPEC["properties"]["elasticPolicy"]["properties"]["rdzvEndpoints"]
    assert (endpoints["maxItems"], endpoints["items"]["maxLength"]) == (16, 261)


def test_no_message_expression_converts_a_number_to_a_string():
    """kube-apiserver's cost estimator has no bound for string(<int>): one such expression and the
    whole CRD is refused at install. Only bounded strings are concatenated into messages."""
    expressions = [(path, rule) for path, node in walk(SCHEMA) for rule in rules(node)
                   if "string(" in rule.get("messageExpression", "") or "string(" in rule["rule"]]
    assert expressions == []


def test_lists_keyed_by_a_field_are_list_maps():
    overrides = SPEC["properties"]["podOverrides"]["properties"]
    keyed = {name: (node.get("x-kubernetes-list-type"), node.get("x-kubernetes-list-map-keys"))
             for name, node in [("env", SPEC["properties"]["env"]), ("volumes", overrides["volumes"]),
                                ("volumeMounts", overrides["volumeMounts"])]}
    assert keyed == {"env": ("map", ["name"]), "volumes": ("map", ["name"]), "volumeMounts": ("map", ["mountPath"])}


def schema_validator() -> jsonschema.Draft7Validator:
    """The spec schema as plain JSON Schema (x-kubernetes-* keywords are ignored)."""
    return jsonschema.Draft7Validator(SPEC)


def without_nulls(obj):
    """What the API server stores: explicit nulls of non-nullable fields are dropped."""
    if isinstance(obj, dict):
        return {k: without_nulls(v) for k, v in obj.items() if v is not None}
    if isinstance(obj, list):
        return [without_nulls(v) for v in obj]
    return obj


@pytest.mark.parametrize("spec", [
    make_spec(),
    make_spec(snapshot={}, resources={"limits": {"cpu": "500m", "memory": "1Gi", "nvidia.com/gpu": 1}},
              elasticPolicy={"nProcPerNode": 2}, runPolicy={"activeDeadlineSeconds": None}),
    make_spec(elasticPolicy={"rdzvBackend": "etcd-v3", "rdzvEndpoints": ["a:2379", "b:2379"]}),
])
def test_the_openapi_schema_accepts_valid_specs(spec):
    assert list(schema_validator().iter_errors(without_nulls(spec))) == []
    assert validate_spec(spec) == []


def test_field_reference_lists_every_field_with_type_default_and_rules():
    text = crd.field_reference()
    assert text.startswith("| Field | Type | Default | Rules | Description |\n|---|---|---|---|---|\n")
    row = next(line for line in text.splitlines() if line.startswith("| `spec.elasticPolicy.rdzvBackend` |"))
    assert row == ("| `spec.elasticPolicy.rdzvBackend` | `c10d` \\| `etcd` \\| `etcd-v3` | `c10d` | "
                   "spec.elasticPolicy.rdzvBackend is immutable: nodes of one job must share one rendezvous | "
                   "Rendezvous backend: c10d (torch's TCPStore, in a small <job>-rdzv store pod by default or on "
                   "node 0 with rdzvStore: node; no etcd needed), etcd (torch's etcd v2 backend) or etcd-v3 "
                   "(ddpjob's etcd v3 backend). |")
    documented = {line.split("`")[1] for line in text.splitlines()[2:]}
    assert {"spec.image", "spec.snapshot.volume", "spec.runPolicy.cleanPodPolicy", "spec.env[].name",
            "spec.podOverrides.annotations", "spec.elasticPolicy.rdzvTimeouts.keepAliveMaxAttempts"} <= documented


def test_reference_flag_prints_the_reference(capsys):
    assert crd.main(["--reference"]) == 0
    assert capsys.readouterr().out == crd.field_reference()


def test_status_reference_flag_prints_the_status_reference(capsys):
    assert crd.main(["--status-reference"]) == 0
    assert capsys.readouterr().out == crd.status_reference()


def model_paths(model, prefix="spec"):
    """Every field path of a pydantic model, by alias, through nested models and lists of them."""
    import typing

    from pydantic import BaseModel

    for name, info in model.model_fields.items():
        path = f"{prefix}.{info.alias or name}"
        yield path
        kind = info.annotation
        if typing.get_origin(kind) is not list:  # Optional[Model] -> Model
            kind = next((a for a in typing.get_args(kind) if a is not type(None)), kind)
        if typing.get_origin(kind) is list:
            kind, path = typing.get_args(kind)[0], f"{path}[]"
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            yield from model_paths(kind, path)


def test_field_reference_documents_every_field_of_the_model():
    from ddpjob_operator.api.spec import DDPJobSpec

    documented = {line.split("`")[1] for line in crd.field_reference().splitlines()[2:]}
    assert set(model_paths(DDPJobSpec)) - documented == set()


def test_the_checked_in_field_reference_matches_the_model():
    """docs/reference.md is generated by `make crd`; a spec change without it fails here."""
    from pathlib import Path

    checked_in = (Path(__file__).resolve().parents[3] / "docs" / "reference.md").read_text()
    assert checked_in == crd.field_reference(), "docs/reference.md is stale: run `make crd`"


def test_status_reference_documents_every_field_of_the_status():
    from ddpjob_operator.api.status import DDPJobStatus

    fields = crd.status_reference().split("## Condition types")[0]
    documented = {line.split("`")[1] for line in fields.splitlines() if line.startswith("| `")}
    assert set(model_paths(DDPJobStatus, "status")) - documented == set()


def test_status_reference_explains_every_condition_type_the_operator_sets():
    # A COND_* constant without its "# what True means" comment would be missing from the table.
    declared = {value for name, value in vars(C).items() if name.startswith("COND_")}
    assert {kind for kind, _ in crd.condition_types()} == declared
    assert all(why for _, why in crd.condition_types())


def test_the_checked_in_status_reference_matches_the_model():
    """docs/status.md is generated by `make crd`; a status change without it fails here."""
    from pathlib import Path

    checked_in = (Path(__file__).resolve().parents[3] / "docs" / "status.md").read_text()
    assert checked_in == crd.status_reference(), "docs/status.md is stale: run `make crd`"
