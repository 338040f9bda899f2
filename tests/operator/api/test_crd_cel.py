"""Run the CRD's CEL rules (x-kubernetes-validations) with cel-python, as the API server would.

The object first gets the schema's defaults (the API server defaults before it
validates); each rule runs with `self` bound to the value at its node, transition
rules only when an old value exists. Every CEL rule must reject what its pydantic
twin rejects, with the same words where it has a messageExpression.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import pytest

from ddpjob_operator.api import crd
from ddpjob_operator.api.spec import validate_spec
from ddpjob_sandbox.jobs import make_ddpjob, make_spec
from tests.operator.corpus_cases import load_corpus
from tests.operator.api.test_crd import without_nulls

celpy = pytest.importorskip("celpy", reason="cel-python is in requirements-test.txt")

SCHEMA = crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
ENV = celpy.Environment()


def with_defaults(node: dict, value: Any) -> Any:
    """`value` with the schema's defaults filled in, recursively."""
    if isinstance(value, dict) and "properties" in node:
        value = dict(value)
        for name, child in node["properties"].items():
            if name not in value and "default" in child:
                value[name] = copy.deepcopy(child["default"])
            if name in value:
                value[name] = with_defaults(child, value[name])
    if isinstance(value, list) and "items" in node:
        value = [with_defaults(node["items"], v) for v in value]
    return value


@functools.lru_cache(maxsize=None)
def program(expr: str):
    return ENV.program(ENV.compile(expr))


def evaluate(expr: str, value: Any, old: Any = None) -> Any:
    activation = {"self": celpy.json_to_cel(value)}
    if old is not None:
        activation["oldSelf"] = celpy.json_to_cel(old)
    return program(expr).evaluate(activation)


def failures(node: dict, value: Any, old: Any = None) -> list[tuple[str, str]]:
    """(message, what the user sees: the messageExpression's value or the message) of each
    rule that rejects `value`."""
    found = []
    for rule in node.get("x-kubernetes-validations", []):
        if "oldSelf" in rule["rule"] and old is None:
            continue
        if not bool(evaluate(rule["rule"], value, old)):
            expr = rule.get("messageExpression")
            found.append((rule["message"], str(evaluate(expr, value)) if expr else rule["message"]))
    for name, child in node.get("properties", {}).items():
        if isinstance(value, dict) and name in value:
            old_child = old.get(name) if isinstance(old, dict) else None
            found += failures(child, value[name], old_child)
    if isinstance(value, dict) and isinstance(node.get("additionalProperties"), dict):
        for item in value.values():  # map values: no transition rules there
            found += failures(node["additionalProperties"], item)
    if isinstance(value, list) and "items" in node:
        for item in value:
            found += failures(node["items"], item)
    return found


def job_failures(spec: dict, old_spec: dict | None = None, name: str = "mlp") -> list[tuple[str, str]]:
    def stored(s):
        return with_defaults(SCHEMA, without_nulls({"metadata": {"name": name}, "spec": s}))
    return failures(SCHEMA, stored(spec), stored(old_spec) if old_spec is not None else None)


def with_message_expression(rules: list[dict]) -> set[str]:
    return {r["message"] for r in rules if "messageExpression" in r}


def _all_rules(node: dict) -> list[dict]:
    found = list(node.get("x-kubernetes-validations", []))
    for child in node.get("properties", {}).values():
        found += _all_rules(child)
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            found += _all_rules(node[key])
    return found


# Corpus cases refused by a CEL rule with a messageExpression (test_bad_input_corpus.py checks
# that each crd case is refused by its rule; here: that the user reads the operator's words).
EXPRESSED = [c for c in load_corpus() if c.crd and c.crd[1] in with_message_expression(_all_rules(SCHEMA))]


@pytest.mark.parametrize("case", EXPRESSED, ids=[c.name for c in EXPRESSED])
def test_cel_message_expressions_read_exactly_like_pydantic_errors(case):
    stored = with_defaults(SCHEMA, without_nulls(case.document()))
    assert [text for _, text in failures(SCHEMA, stored)] == list(case.messages)


def test_every_message_expression_is_read_by_a_corpus_case():
    assert with_message_expression(_all_rules(SCHEMA)) == {c.crd[1] for c in EXPRESSED}


@pytest.mark.parametrize("spec", [
    make_spec(),
    make_spec(replicas=None),
    make_spec(replicas=3, min_replicas=1, max_replicas=4, snapshot={},
              resources={"limits": {"nvidia.com/gpu": 1}}, elasticPolicy={"nProcPerNode": "gpu"}),
    make_spec(module=None, script="/w/train.py", elasticPolicy={"rdzvBackend": "etcd", "rdzvEndpoints": ["e:2379"]}),
    make_spec(env=[{"name": "PYTHONUNBUFFERED", "value": "0"}], podOverrides={"labels": {"team": "a"}}),
    make_spec(elasticPolicy={"nProcPerNode": 8}),
])
def test_cel_accepts_valid_specs(spec):
    assert validate_spec(spec) == [] and job_failures(spec) == []


def test_cel_rejects_names_whose_pod_names_exceed_the_dns_limit_like_the_operator():
    spec = make_spec(replicas=2, max_replicas=11)
    assert job_failures(spec, name="a" * 55) == []
    assert [m for m, _ in job_failures(spec, name="a" * 56)] == [
        "metadata.name is too long: pod names <name>-node-<index> must fit the 63-character DNS label limit"]


@pytest.mark.parametrize("max_replicas", [1, 10, 11, 100, 101, 1000])
def test_cel_counts_the_digits_of_the_largest_node_index_like_the_operator(max_replicas):
    """The CEL twin counts digits with comparisons (string() of an int has no cost bound):
    it must agree with names.name_too_long on both sides of every digit boundary."""
    from ddpjob_operator.api.names import name_too_long
    spec = make_spec(replicas=1, max_replicas=max_replicas)
    for length in (50, 54, 55, 56, 57):
        name = "a" * length
        assert (job_failures(spec, name=name) == []) == (name_too_long(name, max_replicas) is None), length


@pytest.mark.parametrize("field,old,new", [
    ("image", {"image": "a:1"}, {"image": "a:2"}),
    ("spec.elasticPolicy.minReplicas", {"elasticPolicy": {"minReplicas": 1, "maxReplicas": 4}},
     {"elasticPolicy": {"minReplicas": 2, "maxReplicas": 4}}),
    ("spec.elasticPolicy.rdzvBackend", {}, {"elasticPolicy": {"rdzvBackend": "etcd-v3", "rdzvEndpoints": ["e:1"]}}),
    ("spec.elasticPolicy.rdzvStore", {"elasticPolicy": {"rdzvStore": "pod"}}, {"elasticPolicy": {"rdzvStore": "node"}}),
    # unset means pod: pinning node later would move the store of a running job
    ("spec.elasticPolicy.rdzvStore", {}, {"elasticPolicy": {"rdzvStore": "node"}}),
    ("spec.elasticPolicy.rdzvStore", {"elasticPolicy": {"rdzvStore": "node"}}, {}),
])
def test_changing_an_immutable_field_of_a_running_job_is_rejected(field, old, new):
    old_spec, new_spec = make_spec(**old), make_spec(**new)
    messages = job_failures(new_spec, old_spec)
    prefix = field if field.startswith("spec.") else f"spec.{field}"
    assert any(m.startswith(f"{prefix} is immutable") for m, _ in messages), messages


def test_writing_out_the_default_store_placement_is_not_a_change():
    assert job_failures(make_spec(elasticPolicy={"rdzvStore": "pod"}), make_spec()) == []


def test_scaling_and_other_mutable_changes_pass_the_transition_rules():
    old = make_spec(replicas=2, min_replicas=1, max_replicas=4)
    new = make_spec(replicas=4, min_replicas=1, max_replicas=4, args=["--epochs", "9"],
                    runPolicy={"suspend": True}, failurePolicy={"maxRestarts": 9})
    assert job_failures(new, old) == []
