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

from ddpjob_operator.api import crd
from ddpjob_operator.api.spec import validate_spec
from ddpjob_sandbox.jobs import make_spec
from tests.operator.api.test_spec import INVALID_SPECS, spec_with

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
    assert [(c["name"], c["jsonPath"]) for c in VERSION["additionalPrinterColumns"]] == [
        ("Phase", ".status.phase"), ("Ready", ".status.ready"), ("Restarts", ".status.restarts"),
        ("Step", ".status.lastSnapshot.step"), ("Last Snapshot", ".status.lastSnapshot.time"),
        ("Age", ".metadata.creationTimestamp")]


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


IMMUTABLE = ["image", "module", "script", "elasticPolicy.minReplicas", "elasticPolicy.maxReplicas",
             "elasticPolicy.rdzvBackend", "elasticPolicy.rdzvPort", "elasticPolicy.rdzvEndpoints"]


def test_exactly_the_chosen_fields_are_immutable_through_transition_rules():
    immutable = [p[2:] for p, n in walk(SPEC) if any(r["rule"] == "self == oldSelf" for r in rules(n))]
    assert immutable == IMMUTABLE
    # rdzvStore's rule sits on elasticPolicy: it compares the effective value (unset means pod).
    transitions = [r["message"] for r in rules(SPEC["properties"]["elasticPolicy"]) if "oldSelf" in r["rule"]]
    assert transitions == ["spec.elasticPolicy.rdzvStore is immutable: nodes of one job must share one "
                           "rendezvous (unset means pod)"]
    assert rules(SPEC["properties"]["image"]) == [{"rule": "self == oldSelf", "message": (
        "spec.image is immutable: all nodes of a DDP group must run the same code")}]


def cross_field_messages() -> list[str]:
    return [r["message"] for _, n in walk(SCHEMA) for r in rules(n) if "oldSelf" not in r["rule"]]


def test_cross_field_cel_rules_are_present():
    assert cross_field_messages() == [
        "metadata.name is too long: pod names <name>-node-<index> must fit the 63-character DNS label limit",
        "exactly one of spec.module or spec.script must be set",
        "spec.replicas must be >= spec.elasticPolicy.minReplicas",
        "spec.replicas must be <= spec.elasticPolicy.maxReplicas",
        'spec.elasticPolicy.nProcPerNode "gpu" needs spec.resources.limits["nvidia.com/gpu"]',
        "spec.env may not set variables the operator derives from the spec (PET_*, DDPJOB_*): use the spec field instead",
        "spec.elasticPolicy.maxReplicas must be >= spec.elasticPolicy.minReplicas",
        "spec.elasticPolicy.rdzvEndpoints must list at least one etcd host:port when rdzvBackend is etcd or etcd-v3 (or set managedEtcd.enabled: true)",
        MANAGED_ETCD_RULE,
        "spec.elasticPolicy.rdzvEndpoints must be empty when rdzvBackend is c10d (the operator points every node at node 0)",
        "spec.elasticPolicy.rdzvSecretName may only be set when rdzvBackend is etcd or etcd-v3 (c10d has no etcd to authenticate to): remove it or change rdzvBackend",
        "spec.elasticPolicy.rdzvStore may be pod only when rdzvBackend is c10d (etcd backends keep their state in etcd): remove it or set rdzvBackend to c10d",
        "spec.elasticPolicy.rdzvEndpoints must have exactly one entry when rdzvBackend is etcd (torch's v2 backend takes one endpoint; etcd-v3 takes several)",
        'spec.elasticPolicy.nProcPerNode must be an integer >= 1, "gpu" or "auto"',
        "spec.failurePolicy.maxBackoffSeconds must be >= spec.failurePolicy.backoffSeconds",
        "spec.podOverrides.labels may not set the labels the operator selects pods by",
    ]


def test_reserved_env_and_label_rules_name_every_reserved_key():
    from ddpjob_operator.api.spec import RESERVED_ENV, RESERVED_LABELS
    (env_rule,) = [r["rule"] for r in rules(SPEC) if "self.env" in r["rule"]]
    (label_rule,) = rules(SPEC["properties"]["podOverrides"])
    assert all(f"'{name}'" in env_rule for name in RESERVED_ENV)
    assert all(f"'{key}' in self.labels" in label_rule["rule"] for key in RESERVED_LABELS)
    assert SPEC["properties"]["env"]["maxItems"] == 128  # bounds the CEL cost estimate


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


# Corpus entries the schema alone rejects at `kubectl apply`; the rest are caught by a CEL
# rule (see CEL_CAUGHT) or only by the operator (pruned typos, names inside free-form objects).
SCHEMA_CAUGHT = {"image missing", "image empty", "replicas zero", "unknown backend", "port out of range",
                 "bad quantity", "negative restart budget", "exit code zero is not permanent",
                 "unknown clean pod policy", "relative snapshot path", "snapshot volume with two sources",
                 "negative deadline", "rdzv secret name not a DNS name", "queue name not a label value"}
MANAGED_ETCD_RULE = ("spec.elasticPolicy.managedEtcd.enabled needs rdzvBackend etcd or etcd-v3, no rdzvEndpoints "
                     "and no rdzvSecretName (the operator points the nodes at its own plaintext etcd)")
CEL_CAUGHT = {
    "managed etcd with c10d": MANAGED_ETCD_RULE,
    "managed etcd with endpoints": MANAGED_ETCD_RULE,
    "managed etcd with a secret": MANAGED_ETCD_RULE,
    "neither module nor script": "exactly one of spec.module or spec.script must be set",
    "module and script": "exactly one of spec.module or spec.script must be set",
    "max below min": "spec.elasticPolicy.maxReplicas must be >= spec.elasticPolicy.minReplicas",
    "replicas below min": "spec.replicas must be >= spec.elasticPolicy.minReplicas",
    "replicas above max": "spec.replicas must be <= spec.elasticPolicy.maxReplicas",
    "etcd without endpoints": "spec.elasticPolicy.rdzvEndpoints must list at least one etcd host:port when rdzvBackend is etcd or etcd-v3 (or set managedEtcd.enabled: true)",
    "etcd v2 with two endpoints": "spec.elasticPolicy.rdzvEndpoints must have exactly one entry when rdzvBackend is etcd (torch's v2 backend takes one endpoint; etcd-v3 takes several)",
    "c10d with endpoints": "spec.elasticPolicy.rdzvEndpoints must be empty when rdzvBackend is c10d (the operator points every node at node 0)",
    "rdzv secret with c10d": "spec.elasticPolicy.rdzvSecretName may only be set when rdzvBackend is etcd or etcd-v3 (c10d has no etcd to authenticate to): remove it or change rdzvBackend",
    "rdzv store pod with etcd": "spec.elasticPolicy.rdzvStore may be pod only when rdzvBackend is c10d (etcd backends keep their state in etcd): remove it or set rdzvBackend to c10d",
    "nproc word": 'spec.elasticPolicy.nProcPerNode must be an integer >= 1, "gpu" or "auto"',
    "nproc zero": 'spec.elasticPolicy.nProcPerNode must be an integer >= 1, "gpu" or "auto"',
    "nproc gpu without a gpu limit": 'spec.elasticPolicy.nProcPerNode "gpu" needs spec.resources.limits["nvidia.com/gpu"]',
    "backoff cap below first delay": "spec.failurePolicy.maxBackoffSeconds must be >= spec.failurePolicy.backoffSeconds",
    "reserved env": "spec.env may not set variables the operator derives from the spec (PET_*, DDPJOB_*): use the spec field instead",
    "reserved label": "spec.podOverrides.labels may not set the labels the operator selects pods by",
}
OPERATOR_ONLY = {"misspelt field", "reserved volume name", "mount over /dev/shm", "mount over the rdzv secret"}


def test_every_corpus_entry_has_a_layer_that_rejects_it():
    ids = {c[0] for c in INVALID_SPECS}
    assert SCHEMA_CAUGHT | set(CEL_CAUGHT) | OPERATOR_ONLY == ids
    assert not (SCHEMA_CAUGHT & set(CEL_CAUGHT)) and not (OPERATOR_ONLY & (SCHEMA_CAUGHT | set(CEL_CAUGHT)))


@pytest.mark.parametrize("case", INVALID_SPECS, ids=[c[0] for c in INVALID_SPECS])
def test_the_openapi_schema_rejects_exactly_the_schema_caught_corpus_entries(case):
    name, changes, _ = case
    errors = list(schema_validator().iter_errors(without_nulls(spec_with(changes))))
    assert bool(errors) == (name in SCHEMA_CAUGHT), [e.message for e in errors]


@pytest.mark.parametrize("name", sorted(CEL_CAUGHT))
def test_cel_caught_corpus_entries_have_their_rule(name):
    assert CEL_CAUGHT[name] in cross_field_messages()


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
                   "Rendezvous backend: c10d (store on node 0, no extra service), etcd (torch's etcd v2 backend) "
                   "or etcd-v3 (ddpjob's etcd v3 backend). |")
    documented = {line.split("`")[1] for line in text.splitlines()[2:]}
    assert {"spec.image", "spec.snapshot.volume", "spec.runPolicy.cleanPodPolicy", "spec.env[].name",
            "spec.podOverrides.annotations", "spec.elasticPolicy.rdzvTimeouts.keepAliveMaxAttempts"} <= documented


def test_reference_flag_prints_the_reference(capsys):
    assert crd.main(["--reference"]) == 0
    assert capsys.readouterr().out == crd.field_reference()


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
