"""The corpus of invalid DDPJobs against the real kube-apiserver with the generated CRD installed.

tests/operator/api/test_bad_input_corpus.py checks what we believe the API server does (the CRD's
schema through jsonschema, its CEL rules through cel-python); here the API server itself answers,
through a server-side dry-run create with strict field validation (what `kubectl create
--dry-run=server` sends). A case whose belief differs from the server's answer fails here.
"""
from __future__ import annotations

import json
import re

import pytest

from ddpjob_operator.api import crd as crd_module
from ddpjob_sandbox.client import ApiError, KubeClient
from tests.cluster.crds import chart_crd, install_crd
from tests.cluster.dry_run import refusal
from tests.operator.api.test_bad_input_corpus import apiserver_refusal
from tests.operator.api.test_crd import without_nulls
from tests.operator.api.test_crd_cel import failures, with_defaults
from tests.operator.corpus_cases import Case, load_corpus

pytestmark = pytest.mark.cluster

CASES = load_corpus()
SCHEMA = crd_module.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def by_layer(layer: str) -> list:
    return [pytest.param(c, id=c.name) for c in CASES if c.layer == layer]


@pytest.fixture(scope="module")
def installed(control_plane):
    return install_crd(control_plane.client(), chart_crd())


def in_namespace(doc: dict, namespace: str) -> dict:
    """The case's job aimed at the test's namespace (a case may name its own, e.g. ``team``)."""
    if isinstance(doc.get("metadata"), dict):
        doc["metadata"]["namespace"] = namespace
    return doc


def dry_run_create(kube: KubeClient, doc: dict) -> ApiError | None:
    """The server's refusal of ``doc`` in the test's namespace (a dry run), or None."""
    return refusal(kube, "ddpjobs", in_namespace(doc, kube.namespace))


def causes(error: ApiError) -> list[tuple[str, str]]:
    """(field, message) of each cause the server's Status names."""
    details = error.body.get("details", {}) if isinstance(error.body, dict) else {}
    return [(c.get("field", ""), c.get("message", "")) for c in details.get("causes", [])]


def server_path(path: str) -> str:
    """A corpus path (jsonschema's, list indices as parts: spec.env.0.name) as the API server
    spells it (spec.env[0].name)."""
    return re.sub(r"\.(\d+)", r"[\1]", path)


def expected_cel_text(case: Case) -> str:
    """What the user reads for a CEL case: its rule's messageExpression value, else its message."""
    stored = with_defaults(SCHEMA, without_nulls(case.document()))
    return next(text for message, text in failures(SCHEMA, stored) if message == case.crd[1])


@pytest.mark.parametrize("case", by_layer("crd"))
def test_crd_cases_are_refused_by_the_api_server_as_the_corpus_says(installed, kube, case):
    error = dry_run_create(kube, case.document())
    assert error is not None, f"{case.name}: the API server accepted it; the corpus says {case.crd}"
    how, what = case.crd
    found = causes(error)
    if how == "cel":
        text = expected_cel_text(case)
        assert any(message.endswith(f": {text}") for _, message in found), (text, found, str(error))
    elif how == "list-map":
        assert any(field.startswith(f"{what}[") and "Duplicate value" in message for field, message in found), \
            (what, found, str(error))
    else:
        path = server_path(what)
        assert any(field == path or field.startswith((f"{path}.", f"{path}[")) for field, _ in found) \
            or f'unknown field "{path}.' in str(error), (path, found, str(error))


@pytest.mark.parametrize("case", by_layer("operator"))
def test_operator_cases_pass_the_api_server_and_the_crd(installed, kube, case):
    assert dry_run_create(kube, case.document()) is None


# A server-side dry run stops before etcd, so it accepts a job too large to store (too-large):
# these cases go through a real `kubectl create`, as a user's apply would.
@pytest.mark.parametrize("case", by_layer("apiserver"))
def test_apiserver_cases_are_refused_by_the_api_server(installed, kube, case):
    doc = in_namespace(case.document(), kube.namespace)
    result = kube.kubectl("create", "-f", "-", input=json.dumps(doc), check=False)
    assert result.returncode != 0, f"{case.name}: kubectl create accepted it"
    assert apiserver_refusal(case.document()).removesuffix("...") in result.stderr, result.stderr


def test_a_server_side_dry_run_accepts_a_job_too_large_for_etcd(installed, kube):
    (case,) = [c for c in CASES if c.name == "too-large"]
    assert dry_run_create(kube, case.document()) is None
