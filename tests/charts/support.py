"""Helpers for the chart, manifest and Dockerfile tests: render with Helm's Go library, validate objects.

Rendering uses helm-python-sdk (Helm v4's own engine, no helm binary); objects
are checked with kubernetes-validate's strict schemas (unknown fields fail),
and DDPJobs with the CRD's openAPIV3Schema plus its CEL rules.
"""
from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = ROOT / "charts" / "ddpjob-operator"
CHART_CRD = CHART_DIR / "crds" / "ddpjobs.ddpjob.io.yaml"
MANIFESTS_CRD = ROOT / "manifests" / "crds" / "ddpjobs.ddpjob.io.yaml"
EXAMPLES_DIR = ROOT / "manifests" / "examples"
INSTALL_FILE = ROOT / "manifests" / "install.yaml"

# Oldest Kubernetes the chart declares (Chart.yaml kubeVersion: the oldest the cluster tier ran
# on) and the pinned one (scripts/cluster/build-binaries.py).
KUBE_VERSIONS = ["1.35.0", "1.37.0"]
RELEASE = "ddpjob-operator"
NAMESPACE = "ddpjob-system"


def render(values: dict | None = None, *, name: str = RELEASE, namespace: str = NAMESPACE) -> list[dict]:
    """Render the chart like `helm template` and return its objects (NOTES.txt excluded).

    Raises:
        helm_python.HelmValuesError: values rejected by values.schema.json.
        helm_python.HelmRenderError: a template failed (including `fail` checks).
    """
    with helm.Chart.load(CHART_DIR) as chart:
        rendered = chart.render(values, name=name, namespace=namespace, is_install=True)
    objects = []
    for path in sorted(rendered):
        if path.endswith(".yaml"):
            objects.extend(doc for doc in yaml.safe_load_all(rendered[path]) if doc)
    return objects


def render_notes(values: dict | None = None) -> str:
    """The rendered NOTES.txt shown after `helm install`."""
    with helm.Chart.load(CHART_DIR) as chart:
        rendered = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    return rendered["ddpjob-operator/templates/NOTES.txt"]


def by_kind(objects: list[dict], kind: str) -> list[dict]:
    """Objects of one kind, in render order."""
    return [obj for obj in objects if obj["kind"] == kind]


def one(objects: list[dict], kind: str) -> dict:
    """The single object of ``kind``; fails the test when there are none or several."""
    found = by_kind(objects, kind)
    assert len(found) == 1, f"expected one {kind}, rendered {len(found)}"
    return found[0]


def validate_k8s(obj: dict, version: str) -> None:
    """Validate a built-in Kubernetes object against that version's strict schema.

    Raises:
        AssertionError: naming the object, the field path and the schema message.
    """
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as error:
        path = ".".join(str(part) for part in error.caught.absolute_path)
        raise AssertionError(
            f"{obj['kind']}/{obj['metadata'].get('name')} invalid for Kubernetes {version}: "
            f"{path}: {error.caught.message}") from None


def load_yaml_documents(path: Path) -> list[dict]:
    """All non-empty YAML documents of a file."""
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def load_crd() -> dict | None:
    """The generated DDPJob CRD from the chart, or None while it has not been generated."""
    if not CHART_CRD.exists():
        return None
    return load_yaml_documents(CHART_CRD)[0]


def served_schema(crd: dict, version: str = "v1alpha1") -> dict:
    """The openAPIV3Schema of one served CRD version."""
    for entry in crd["spec"]["versions"]:
        if entry["name"] == version:
            return entry["schema"]["openAPIV3Schema"]
    raise AssertionError(f"CRD serves no version {version!r}")


def strict_json_schema(schema: dict) -> dict:
    """Turn a structural CRD schema into a JSON Schema that rejects unknown fields.

    `kubectl apply` uses strict field validation by default: a field the
    schema does not declare is an error, not silently pruned. Objects with
    declared properties and no x-kubernetes-preserve-unknown-fields therefore
    get additionalProperties: false; `nullable` becomes a null type.
    """
    schema = copy.deepcopy(schema)

    def visit(node: Any) -> None:
        if isinstance(node, list):
            for item in node:
                visit(item)
            return
        if not isinstance(node, dict):
            return
        if node.get("nullable") and "type" in node:
            node["type"] = [node["type"], "null"]
        if ("properties" in node and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")):
            node["additionalProperties"] = False
        for value in node.values():
            visit(value)

    visit(schema)
    return schema


def schema_errors(obj: dict, schema: dict) -> list[str]:
    """Every violation of ``schema`` by ``obj`` as 'path: message', empty when valid."""
    validator = jsonschema.Draft7Validator(strict_json_schema(schema))
    return [f"{'.'.join(map(str, error.absolute_path)) or '<root>'}: {error.message}"
            for error in sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.path)))]


def cel_rules(schema: dict, value: Any, path: str = "") -> Iterator[tuple[str, dict, Any]]:
    """Yield (path, rule, self) for each x-kubernetes-validations rule that applies to ``value``.

    Walks the schema alongside the object, so a rule is evaluated with `self`
    bound to the value at its own schema node, as the API server does. Rules
    under absent fields do not apply.
    """
    for rule in schema.get("x-kubernetes-validations", []):
        yield path or "<root>", rule, value
    if isinstance(value, dict):
        for key, child in value.items():
            if key in schema.get("properties", {}):
                yield from cel_rules(schema["properties"][key], child, f"{path}.{key}" if path else key)
            elif isinstance(schema.get("additionalProperties"), dict):
                yield from cel_rules(schema["additionalProperties"], child, f"{path}.{key}")
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, child in enumerate(value):
            yield from cel_rules(schema["items"], child, f"{path}[{index}]")


class CelUnsupported(Exception):
    """A rule that this test environment's CEL cannot evaluate (transition rule, Kubernetes-only function)."""


def evaluate_cel(rule: dict, self_value: Any) -> bool:
    """Evaluate one CRD validation rule with cel-python.

    Raises:
        CelUnsupported: for transition rules (oldSelf) and expressions using
            Kubernetes' CEL extensions that cel-python lacks.
    """
    import celpy  # local: only the CEL tests pay for its import

    expression = rule["rule"]
    if "oldSelf" in expression:
        raise CelUnsupported(f"transition rule needs an old object: {expression}")
    env = celpy.Environment()
    try:
        program = env.program(env.compile(expression))
        result = program.evaluate({"self": celpy.json_to_cel(self_value)})
    except Exception as error:  # celpy raises its own hierarchy for unknown functions
        raise CelUnsupported(f"{expression}: {error}") from error
    if isinstance(result, Exception):
        raise CelUnsupported(f"{expression}: {result}")
    return bool(result)
