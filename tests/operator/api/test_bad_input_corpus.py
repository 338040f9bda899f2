"""Every invalid DDPJob of the corpus is refused by the earliest layer that can, with the same words.

For each file of tests/operator/corpus/ (format: corpus_cases.py):
  (a) the layer it names refuses it, and no earlier one: `apiserver` cases fail the API server's
      own checks; `crd` cases fail the generated CRD (strict schema, list-map keys, CEL rules,
      each run as the API server would); `operator` cases pass all of that;
  (b) validate_job reports exactly its messages, and an operator case ends as an InvalidSpec
      condition and Event with them;
  (c) `ddpjob validate FILE` exits 1 printing them, without a traceback.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import jsonschema
import pytest

from ddpjob_operator import cli
from ddpjob_operator.api import constants as C
from ddpjob_operator.api import crd
from ddpjob_operator.api.validation import validate_job
from ddpjob_operator.decide.observed import Observed
from ddpjob_operator.decide.reconcile import reconcile
from tests.charts.support import strict_json_schema
from tests.operator.builders import T0
from tests.operator.corpus_cases import LAYERS, load_corpus
from tests.operator.api.test_crd import without_nulls
from tests.operator.api.test_crd_cel import failures, with_defaults

CASES = load_corpus()
SCHEMA = crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
# kubectl apply validates fields strictly (since 1.27): an unknown field is an error, not pruned.
STRICT = jsonschema.Draft7Validator(strict_json_schema(SCHEMA))
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
ETCD_REQUEST_LIMIT = 1536 * 1024  # etcd's default --max-request-bytes


def by_layer(layer: str) -> list:
    return [pytest.param(c, id=c.name) for c in CASES if c.layer == layer]


def apiserver_refusal(doc: dict) -> str | None:
    """What the API server answers before our CRD's schema runs; None when the job gets that far."""
    if (doc.get("apiVersion"), doc.get("kind")) != ("ddpjob.io/v1alpha1", "DDPJob"):
        return f'no matches for kind "{doc.get("kind")}" in version "{doc.get("apiVersion")}"'
    meta = doc.get("metadata")
    if meta is not None and not isinstance(meta, dict):
        # Decoded into an ObjectMeta before our schema runs: kubectl refuses it ("... into Go
        # struct field metadataOnlyObject.metadata of type v1.ObjectMeta"), and so does
        # kube-apiserver v1.37.2 with HTTP 400 ("... into Go value of type v1.ObjectMeta").
        json_type = "array" if isinstance(meta, list) else "bool" if isinstance(meta, bool) else \
            "string" if isinstance(meta, str) else "number"
        return f"cannot unmarshal {json_type} into Go"
    if isinstance(meta, dict):
        name = meta.get("name")
        if not name:
            return "name or generateName is required"
        if len(name) > 253 or not DNS_SUBDOMAIN.fullmatch(name):
            return f"metadata.name: Invalid value: {name!r}: a lowercase RFC 1123 subdomain must ..."
    if len(json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()) > ETCD_REQUEST_LIMIT:
        return "etcdserver: request is too large"
    return None


def duplicate_list_map_keys(node: dict, value, path: str = "") -> list[str]:
    """Paths of x-kubernetes-list-type: map lists holding one key twice (the API server refuses them)."""
    found = []
    if isinstance(value, list) and node.get("x-kubernetes-list-type") == "map":
        keys = [tuple(item.get(k) for k in node["x-kubernetes-list-map-keys"]) for item in value]
        if len(set(keys)) != len(keys):
            found.append(path)
    if isinstance(value, dict):
        for name, child in node.get("properties", {}).items():
            if name in value:
                found += duplicate_list_map_keys(child, value[name], f"{path}.{name}" if path else name)
    if isinstance(value, list) and "items" in node:
        for i, item in enumerate(value):
            found += duplicate_list_map_keys(node["items"], item, f"{path}.{i}")
    return found


def crd_refusals(doc: dict) -> list[tuple[str, str]]:
    """How the generated CRD refuses `doc`: ("schema", path), ("list-map", path) or ("cel", message).

    CEL rules run on the defaulted object and only when the schema passed: they are typed by
    the schema, and the API server reports schema errors first.
    """
    stored = without_nulls(doc)
    refusals = [("schema", ".".join(map(str, e.absolute_path))) for e in STRICT.iter_errors(stored)]
    refusals += [("list-map", path) for path in duplicate_list_map_keys(SCHEMA, stored)]
    if refusals:
        return refusals
    return [("cel", message) for message, _ in failures(SCHEMA, with_defaults(SCHEMA, stored))]


def test_the_corpus_holds_at_least_40_cases_in_every_layer():
    counts = {layer: sum(c.layer == layer for c in CASES) for layer in LAYERS}
    assert len(CASES) >= 40 and all(counts.values()), counts


def test_every_cel_rule_of_the_crd_is_exercised_by_a_corpus_case():
    def messages(node):
        yield from (r["message"] for r in node.get("x-kubernetes-validations", []) if "oldSelf" not in r["rule"])
        for child in node.get("properties", {}).values():
            yield from messages(child)
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                yield from messages(node[key])
    exercised = {c.crd[1] for c in CASES if c.crd and c.crd[0] == "cel"}
    assert set(messages(SCHEMA)) - exercised == set()


@pytest.mark.parametrize("case", by_layer("apiserver"))
def test_apiserver_cases_are_refused_before_the_crd_runs(case):
    assert apiserver_refusal(case.document()) is not None


@pytest.mark.parametrize("case", by_layer("crd"))
def test_crd_cases_are_refused_by_the_rule_they_name(case):
    refusals = crd_refusals(case.document())
    assert case.crd in refusals, refusals


@pytest.mark.parametrize("case", by_layer("operator"))
def test_operator_cases_pass_the_api_server_and_the_crd(case):
    doc = case.document()
    assert apiserver_refusal(doc) is None
    assert crd_refusals(doc) == []


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in CASES])
def test_validate_job_reports_exactly_the_expected_messages(case):
    assert [e.message for e in validate_job(case.document())] == list(case.messages)


@pytest.mark.parametrize("case", by_layer("operator"))
def test_operator_cases_end_as_an_invalid_spec_condition_and_event(case):
    result = reconcile(case.document(), Observed(service_exists=False), T0)
    expected = "; ".join(case.messages)
    condition = next(c for c in result.status["conditions"] if c["type"] == C.COND_INVALID_SPEC)
    assert (result.status["phase"], condition["status"], condition["message"]) == ("Failed", "True", expected)
    assert [(e.reason, e.message) for e in result.events] == [(C.REASON_INVALID_SPEC, expected)]
    assert result.actions == [] or all(type(a).__name__ == "Requeue" for a in result.actions)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in CASES])
def test_ddpjob_validate_exits_1_with_the_messages(case, capsys):
    assert cli.main(["validate", str(case.path)]) == cli.EXIT_INVALID
    out, err = capsys.readouterr()
    assert (out, err.splitlines()) == ("", [f"{case.path}: {m}" for m in case.messages])


# One case of each layer through the real command line, as a user runs it.
SAMPLE = [next(c for c in CASES if c.layer == layer) for layer in LAYERS]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in SAMPLE])
def test_the_ddpjob_command_prints_the_messages_without_a_traceback(case):
    run = subprocess.run([sys.executable, "-m", "ddpjob_operator.cli", "validate", str(case.path)],
                         capture_output=True, text=True, timeout=60)
    assert (run.returncode, run.stdout) == (cli.EXIT_INVALID, "")
    assert run.stderr.splitlines() == [f"{case.path}: {m}" for m in case.messages]
