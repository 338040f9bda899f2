"""The security fields of the pods the operator renders, and the spec rules that guard them (pure).

Whether a rendered pod passes Pod Security "restricted" is the API server's to say:
tests/cluster/test_pod_security_on_apiserver.py dry-runs every pod the operator renders into a
namespace that enforces it; tests/operator/render/test_render.py pins the securityContext each
pod gets. Here: the security overrides which cannot work are refused naming the field, and the
defaults match what the docs say.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.job_ref import JobRef
from ddpjob_operator.api.validation import parse_spec, validate_spec
from ddpjob_operator.render.etcd_pod import render_etcd_pod
from ddpjob_operator.render.node_pod import render_pod
from ddpjob_sandbox.jobs import make_spec
from tests.operator.api.test_crd import schema_validator, without_nulls

REF = JobRef(name="mlp", namespace="team-a", uid="6f1c2a9e-0000-4000-8000-000000000001")


@pytest.mark.parametrize("overrides,message", [
    ({"securityContext": {"runAsUser": 0}},
     "spec.podOverrides.securityContext.runAsUser (0) is root, which runAsNonRoot: true (the default) forbids, "
     "so the kubelet would never start the container: also set spec.podOverrides.securityContext.runAsNonRoot: false"),
    ({"containerSecurityContext": {"runAsUser": 0}},
     "spec.podOverrides.containerSecurityContext.runAsUser (0) is root, which runAsNonRoot: true (the default) "
     "forbids, so the kubelet would never start the container: also set "
     "spec.podOverrides.containerSecurityContext.runAsNonRoot: false"),
    ({"securityContext": {"runAsUser": 0, "runAsNonRoot": False}, "containerSecurityContext": {"runAsNonRoot": True}},
     "spec.podOverrides.containerSecurityContext.runAsUser (0) is root, which runAsNonRoot: true (the default) "
     "forbids, so the kubelet would never start the container: also set "
     "spec.podOverrides.containerSecurityContext.runAsNonRoot: false"),
    ({"securityContext": {"runAsUser": -1}}, "spec.podOverrides.securityContext.runAsUser (-1) must be >= 0"),
    ({"containerSecurityContext": {"procMount": "Host"}},
     "spec.podOverrides.containerSecurityContext.procMount (\"Host\") must be one of 'Default' or 'Unmasked'"),
    ({"containerSecurityContext": {"runAsUsr": 1000}},
     "spec.podOverrides.containerSecurityContext.runAsUsr (1000) is not a field of this object: "
     "did you mean 'runAsUser'?"),
    ({"securityContext": {"seccompProfile": {"type": "None"}}},
     "spec.podOverrides.securityContext.seccompProfile.type (\"None\") must be one of "
     "'RuntimeDefault', 'Localhost' or 'Unconfined'"),
])
def test_security_overrides_that_cannot_work_are_rejected_naming_the_field(overrides, message):
    assert [e.message for e in validate_spec(make_spec(podOverrides=overrides))] == [message]


@pytest.mark.parametrize("overrides", [
    {"securityContext": {"runAsUser": 0, "runAsNonRoot": False}},
    {"securityContext": {"runAsNonRoot": False}, "containerSecurityContext": {"runAsUser": 0}},
    {"containerSecurityContext": {"runAsUser": 0, "runAsNonRoot": False}},
])
def test_running_as_root_is_allowed_when_runasnonroot_is_turned_off_where_it_applies(overrides):
    assert validate_spec(make_spec(podOverrides=overrides)) == []


@pytest.mark.parametrize("size", ["0", "0Gi", "0.0", "-1Gi", "500m", "8GB", "1e9", ""])
def test_a_shared_memory_size_must_be_a_positive_byte_quantity(size):
    message = 'must be a size in bytes above zero, written as a quantity string such as "8Gi" or "512Mi"'
    assert [e.message for e in validate_spec(make_spec(sharedMemorySize=size))] == [
        f'spec.sharedMemorySize ("{size}") {message}']
    assert list(schema_validator().iter_errors(without_nulls(make_spec(sharedMemorySize=size))))


@pytest.mark.parametrize("size", ["8Gi", "1.5Gi", "512Mi", "1G", ".5Gi", "1048576"])
def test_positive_shared_memory_sizes_pass_the_model_and_the_crd_schema(size):
    spec = make_spec(sharedMemorySize=size)
    assert validate_spec(spec) == []
    assert list(schema_validator().iter_errors(without_nulls(spec))) == []


def test_the_default_uid_is_the_one_documented_in_the_security_fields():
    # The CRD and docs/reference.md say which uid the pods run as; they must follow the constant.
    from ddpjob_operator.api import crd

    reference = crd.field_reference()
    assert f"runAsUser/runAsGroup/fsGroup {C.POD_UID}" in reference
    assert render_pod(REF, parse_spec(make_spec()), 0)["spec"]["securityContext"]["runAsUser"] == C.POD_UID


def test_the_managed_etcd_pod_runs_non_root_read_only_and_without_a_token():
    spec = parse_spec(make_spec(elasticPolicy={"rdzvBackend": "etcd-v3", "managedEtcd": {"enabled": True}},
                                podOverrides={"serviceAccountName": "trainer", "securityContext": {"runAsUser": 1000}}))
    pod = render_etcd_pod(REF, spec)["spec"]
    # Its own image, so neither the trainer's account nor its uid override applies.
    assert pod["automountServiceAccountToken"] is False and "serviceAccountName" not in pod
    assert pod["securityContext"] == {"runAsNonRoot": True, "runAsUser": C.POD_UID, "runAsGroup": C.POD_GID,
                                      "fsGroup": C.POD_GID, "seccompProfile": {"type": "RuntimeDefault"}}
    assert pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True


def test_the_override_example_in_the_install_docs_is_valid_and_reaches_the_pods():
    # That its pods still pass "restricted": tests/cluster/test_pod_security_on_apiserver.py.
    docs = (Path(__file__).resolve().parents[3] / "docs" / "install.md").read_text()
    section = docs.split("### Your own trainer image", 1)[1]
    example = yaml.safe_load(re.search(r"```yaml\n(.*?)```", section, re.DOTALL).group(1))["spec"]
    assert validate_spec(make_spec(**example)) == []
    assert render_pod(REF, parse_spec(make_spec(**example)), 0)["spec"]["securityContext"]["runAsUser"] == 1000
