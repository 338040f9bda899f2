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
from ddpjob_operator.api.spec import MAX_REPLICAS, _replica_range, cel_int_text
from ddpjob_operator.api.validation import parse_spec, validate_spec
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
            found.append((rule["message"], str(evaluate(expr, value, old)) if expr else rule["message"]))
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
    """A corpus case is one file; a transition rule's words are read by the tests of changes below."""
    single = [r for r in _all_rules(SCHEMA) if "oldSelf" not in r["rule"]]
    assert with_message_expression(single) == {c.crd[1] for c in EXPRESSED}
    assert with_message_expression([r for r in _all_rules(SCHEMA) if "oldSelf" in r["rule"]]) == {SIZE_RULE}


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


@pytest.mark.parametrize("spares", [1, 9, 16])
def test_cel_counts_spare_pods_in_the_largest_node_index_like_the_operator(spares):
    """Spares continue the node indexes (<job>-node-<replicas>...): 91 + 9 pods put index 99's
    two digits at the boundary, 991 + 9 reach four digits, past MAX_REPLICAS alone."""
    from ddpjob_operator.api.names import name_too_long
    for replicas in (1, 91, 991, 1000):
        spec = make_spec(replicas=replicas, elasticPolicy={"spareReplicas": spares})
        for length in (49, 50, 54, 55, 56):
            name = "a" * length
            assert (job_failures(spec, name=name) == []) == (name_too_long(name, replicas + spares) is None), (
                replicas, length)


@pytest.mark.parametrize("spec,full", [
    (make_spec(replicas=2, elasticPolicy={"spareReplicas": 1}), True),  # fixed size: max defaults to replicas
    (make_spec(replicas=None, min_replicas=3, elasticPolicy={"spareReplicas": 2}), True),  # replicas defaults to min
    (make_spec(replicas=4, min_replicas=2, max_replicas=4, elasticPolicy={"spareReplicas": 1}), True),
    (make_spec(replicas=2, min_replicas=1, max_replicas=4, elasticPolicy={"spareReplicas": 1}), False),
    (make_spec(replicas=None, min_replicas=1, max_replicas=2, elasticPolicy={"spareReplicas": 1}), False),
    (make_spec(replicas=2, min_replicas=1, max_replicas=4, elasticPolicy={"spareReplicas": 0}), True),
])
def test_cel_allows_spares_only_beside_a_full_group_like_the_operator(spec, full):
    cel_messages = [shown for _, shown in job_failures(spec)]
    operator_messages = [e.message for e in validate_spec(spec)]
    assert (cel_messages == []) == full and cel_messages == operator_messages


@pytest.mark.parametrize("field,old,new", [
    ("image", {"image": "a:1"}, {"image": "a:2"}),
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


# --- The size of a job: fixed by the --nnodes its agents were started with -----------------------

SIZE_RULE = ("spec.elasticPolicy minReplicas:maxReplicas may not change once the job exists: its torchrun "
             "agents were started with --nnodes minReplicas:maxReplicas (unset, both default to spec.replicas, "
             "so a job created without them keeps its size); delete and recreate the job to change them")


def test_scaling_a_job_created_without_min_and_max_is_refused_naming_both_sizes():
    """What `kubectl scale --replicas=5` sends for a job created with replicas: 3 alone."""
    assert job_failures(make_spec(replicas=5), make_spec(replicas=3)) == [(SIZE_RULE, (
        "spec.replicas (5) may not change from 3: the job has no spec.elasticPolicy.minReplicas or maxReplicas, "
        "so its torchrun agents were started with --nnodes 3:3 (both default to spec.replicas); delete and "
        "recreate the job with the minReplicas and maxReplicas it may be scaled within"))]


@pytest.mark.parametrize("new,shown", [
    (make_spec(replicas=3, min_replicas=2, max_replicas=5), "2:5"),  # both added later
    (make_spec(replicas=3, max_replicas=5), "3:5"),  # only maxReplicas: minReplicas stays 3
    (make_spec(replicas=3, min_replicas=1), "1:3"),
])
def test_adding_min_or_max_replicas_to_a_created_job_is_refused_with_the_effective_ranges(new, shown):
    assert job_failures(new, make_spec(replicas=3)) == [(SIZE_RULE, (
        f"spec.elasticPolicy minReplicas:maxReplicas ({shown}) may not change from 3:3, the --nnodes its "
        "torchrun agents were started with (unset, both default to spec.replicas); delete and recreate the job "
        "to change them"))]


@pytest.mark.parametrize("old,new,shown", [
    (make_spec(replicas=2, min_replicas=1, max_replicas=4), make_spec(replicas=2, min_replicas=1, max_replicas=8),
     "(1:8) may not change from 1:4"),
    (make_spec(replicas=2, min_replicas=1, max_replicas=4), make_spec(replicas=2, min_replicas=2, max_replicas=4),
     "(2:4) may not change from 1:4"),
    # removing them is a change too: the range falls back to replicas
    (make_spec(replicas=2, min_replicas=1, max_replicas=4), make_spec(replicas=2), "(2:2) may not change from 1:4"),
    (make_spec(replicas=None, min_replicas=120, max_replicas=1000), make_spec(replicas=None, min_replicas=120,
                                                                              max_replicas=999),
     "(120:999) may not change from 120:1000"),
])
def test_changing_the_range_of_an_elastic_job_is_refused_with_both_ranges(old, new, shown):
    [(message, text)] = job_failures(new, old)
    assert message == SIZE_RULE and text.startswith(f"spec.elasticPolicy minReplicas:maxReplicas {shown}, "), text


@pytest.mark.parametrize("old,new", [
    (make_spec(replicas=3), make_spec(replicas=3, min_replicas=3, max_replicas=3)),  # the defaults written out
    (make_spec(replicas=2, min_replicas=1, max_replicas=4), make_spec(replicas=4, min_replicas=1, max_replicas=4)),
    (make_spec(replicas=2, min_replicas=1, max_replicas=4), make_spec(replicas=1, min_replicas=1, max_replicas=4)),
    (make_spec(replicas=2, min_replicas=1, max_replicas=4), make_spec(replicas=None, min_replicas=1, max_replicas=4)),
    (make_spec(replicas=None, min_replicas=2), make_spec(replicas=2, min_replicas=2)),
])
def test_scaling_within_the_range_the_job_was_created_with_passes(old, new):
    assert job_failures(new, old) == []


def test_scaling_an_elastic_job_past_its_max_is_refused_by_the_range_rule_with_both_numbers():
    old = make_spec(replicas=2, min_replicas=1, max_replicas=4)
    assert job_failures(make_spec(replicas=5, min_replicas=1, max_replicas=4), old) == [(
        "spec.replicas must be <= spec.elasticPolicy.maxReplicas",
        "spec.replicas (5) must be <= spec.elasticPolicy.maxReplicas (4)")]


SIZES = [make_spec(replicas=replicas, min_replicas=low, max_replicas=high)
         for replicas in (None, 1, 3, 7) for low in (None, 1, 3) for high in (None, 3, 9)]


@pytest.mark.parametrize("spec", [s for s in SIZES if not validate_spec(s)])
def test_the_rule_resolves_min_and_max_as_the_operator_does(spec):
    """The transition rule compares what the operator renders into --nnodes: its defaults must be
    the model's (_resolve_replica_defaults) for every combination of given fields."""
    stored = job_stored(spec)["spec"]
    resolved = parse_spec(spec)
    assert [int(evaluate(expr, stored)) for expr in _replica_range("self")] == [
        resolved.min_replicas, resolved.max_replicas]


def job_stored(spec: dict) -> dict:
    return with_defaults(SCHEMA, without_nulls({"metadata": {"name": "mlp"}, "spec": spec}))


def test_cel_int_text_spells_every_number_a_replica_field_may_hold():
    spelt = program(cel_int_text("n"))
    assert [str(spelt.evaluate({"n": celpy.celtypes.IntType(n)})) for n in range(MAX_REPLICAS + 1)] == [
        str(n) for n in range(MAX_REPLICAS + 1)]
