"""values.yaml is documented and strict; names respect the 63-character limit; selector labels stay stable."""
from __future__ import annotations

import json
import re

import helm_python as helm
import pytest
import yaml

from tests.charts.support import CHART_DIR, KUBE_VERSIONS, one, render

VALUES_TEXT = (CHART_DIR / "values.yaml").read_text()
SCHEMA = json.loads((CHART_DIR / "values.schema.json").read_text())
LONG_RELEASE = "a" * 40 + "-training-team"  # 53 characters: Helm's longest release name


def leaf_paths(values: dict, prefix: str = "") -> list[str]:
    """Dotted paths of the documented keys: leaves and empty containers (maps of user data)."""
    paths = []
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and path not in ("resources", "etcd.resources"):
            paths.extend(leaf_paths(value, f"{path}."))
        else:
            paths.append(path)
    return paths


@pytest.mark.parametrize("path", leaf_paths(yaml.safe_load(VALUES_TEXT)))
def test_every_value_is_documented_name_first(path):
    assert re.search(rf"^\s*# {re.escape(path)} -- \S", VALUES_TEXT, re.MULTILINE), (
        f"values.yaml: add a comment '# {path} -- <what it does>' above the key")


def test_every_value_key_is_camel_case():
    for path in leaf_paths(yaml.safe_load(VALUES_TEXT)):
        for part in path.split("."):
            assert re.fullmatch(r"[a-z][a-zA-Z0-9]*", part), f"values key {path!r}: use camelCase"


def object_schemas(node, path="$"):
    if isinstance(node, dict):
        if node.get("type") == "object":
            yield path, node
        for key, value in node.items():
            yield from object_schemas(value, f"{path}.{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from object_schemas(value, f"{path}[{index}]")


def test_schema_closes_every_object_it_describes():
    """Objects with named properties forbid others; maps of user data type their values."""
    for path, schema in object_schemas(SCHEMA):
        if "properties" in schema:
            assert schema.get("additionalProperties") is False, f"{path}: set additionalProperties: false"
        elif "additionalProperties" in schema:
            assert isinstance(schema["additionalProperties"], dict), f"{path}: type the map's values"


def test_schema_accepts_the_default_values():
    with helm.Chart.load(CHART_DIR) as chart:
        chart.validate_schema(chart.values)


@pytest.mark.parametrize(("values", "message"), [
    ({"replicaCout": 2}, "additional properties 'replicaCout' not allowed"),
    ({"image": {"tagg": "1.0"}}, "additional properties 'tagg' not allowed"),
    ({"metrics": {"enable": True}}, "additional properties 'enable' not allowed"),
    ({"metrics": {"enabled": "yes"}}, "/metrics/enabled"),
    ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
    ({"watchNamespaces": ["Team_A"]}, "/watchNamespaces/0"),
    ({"livenessPort": 0}, "/livenessPort"),
    ({"maxReplicas": 0}, "/maxReplicas"),
    ({"maxReplicas": 1001}, "/maxReplicas"),
    ({"progressPollSeconds": -1}, "/progressPollSeconds"),
])
def test_schema_rejects_typos_and_bad_values_naming_the_key(values, message):
    with pytest.raises(helm.HelmValuesError) as raised:
        render(values)
    assert message in str(raised.value)


def test_fullname_is_truncated_to_63_characters_without_a_trailing_dash():
    objects = render(name=LONG_RELEASE)
    deployment = one(objects, "Deployment")
    name = deployment["metadata"]["name"]
    assert len(f"{LONG_RELEASE}-ddpjob-operator") > 63
    assert len(name) == 63 and name == f"{LONG_RELEASE}-ddpjob-operator"[:63].rstrip("-")
    for obj in objects:
        assert len(obj["metadata"]["name"]) <= 63, obj["metadata"]["name"]
        for key, value in obj["metadata"].get("labels", {}).items():
            assert len(value) <= 63, f"{obj['kind']} label {key}={value}"


def test_fullname_cuts_a_trailing_dash_left_by_truncation():
    override = "x" * 57 + "-yz"  # "prod-" + override, cut at 63, ends in "-"
    name = one(render({"nameOverride": override}, name="prod"), "Deployment")["metadata"]["name"]
    assert f"prod-{override}"[:63].endswith("-")
    assert name == f"prod-{'x' * 57}"


@pytest.mark.parametrize(("release", "values", "expected"), [
    ("ddpjob-operator", {}, "ddpjob-operator"),
    ("prod-ddpjob-operator", {}, "prod-ddpjob-operator"),
    ("prod", {}, "prod-ddpjob-operator"),
    ("prod", {"nameOverride": "ddp"}, "prod-ddp"),
    ("prod", {"fullnameOverride": "training-operator"}, "training-operator"),
])
def test_fullname_follows_release_and_overrides(release, values, expected):
    assert one(render(values, name=release), "Deployment")["metadata"]["name"] == expected


def test_selector_labels_are_the_immutable_subset_and_survive_upgrades():
    """A Deployment selector cannot change; version labels must stay out of it."""
    old = one(render(), "Deployment")
    new = one(render({"image": {"tag": "9.9.9"}, "podLabels": {"team": "ml"}}), "Deployment")
    selector = old["spec"]["selector"]["matchLabels"]
    assert selector == {"app.kubernetes.io/name": "ddpjob-operator", "app.kubernetes.io/instance": "ddpjob-operator"}
    assert new["spec"]["selector"]["matchLabels"] == selector
    assert selector.items() <= old["spec"]["template"]["metadata"]["labels"].items()
    assert selector.items() <= new["spec"]["template"]["metadata"]["labels"].items()


def test_common_labels_follow_the_kubernetes_recommendations():
    labels = one(render(), "Deployment")["metadata"]["labels"]
    assert labels["helm.sh/chart"] == "ddpjob-operator-0.1.0"
    assert labels["app.kubernetes.io/version"] == "0.1.0"
    assert labels["app.kubernetes.io/managed-by"] == "Helm"
    assert labels["app.kubernetes.io/component"] == "operator"


def test_chart_metadata_declares_kube_and_app_versions():
    with helm.Chart.load(CHART_DIR) as chart:
        metadata = chart.metadata
    assert metadata["apiVersion"] == "v2" and metadata["appVersion"] == "0.1.0"
    assert metadata["kubeVersion"] == f">={KUBE_VERSIONS[0]}-0"


@pytest.mark.parametrize("path", leaf_paths(yaml.safe_load(VALUES_TEXT)))
def test_install_docs_list_every_value(path):
    docs = (CHART_DIR.parents[1] / "docs" / "install.md").read_text()
    assert f"| `{path}` |" in docs, f"docs/install.md: add a row for `{path}` to the values table"
