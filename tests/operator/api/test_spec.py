"""The spec model: defaults, and every rule reported with field, value and rule.

The corpus of invalid jobs (one per rule) is tests/operator/corpus/, run by test_bad_input_corpus.py;
here: how errors are collected and shown, defaults, and the rules' edges.
"""

from __future__ import annotations

import copy

import pytest

from ddpjob_operator.api.job_ref import JobRef
from ddpjob_operator.api.spec import DDPJobSpec
from ddpjob_operator.api.validation import (
    MAX_DEPTH, OBJECT_SIZE_LIMIT, FieldError, InvalidSpecError, document_errors, parse_job, parse_spec, validate_job,
    validate_spec
)
from ddpjob_sandbox.jobs import make_ddpjob, make_spec


def spec_with(changes: dict) -> dict:
    """make_spec() with `changes` applied; a None value removes the field."""
    spec = make_spec()
    for key, value in changes.items():
        if value is None:
            spec.pop(key, None)
        else:
            spec[key] = value
    return spec


def test_all_cross_field_errors_are_reported_together_not_just_the_first():
    errors = validate_spec(spec_with({
        "script": "/w/train.py", "replicas": 9,
        "elasticPolicy": {"minReplicas": 3, "maxReplicas": 2, "nProcPerNode": "gpu"},
        "failurePolicy": {"backoffSeconds": 10, "maxBackoffSeconds": 1},
    }))
    assert [e.path for e in errors] == [
        "spec.script",
        "spec.elasticPolicy.maxReplicas",
        "spec.replicas",
        "spec.elasticPolicy.nProcPerNode",
        "spec.failurePolicy.maxBackoffSeconds",
    ]


def test_all_type_errors_are_reported_together():
    errors = validate_spec({"replicas": 0, "elasticPolicy": {"maxRestarts": -2}})
    assert [e.message for e in errors] == [
        "spec.replicas (0) must be >= 1",
        "spec.image is required",
        "spec.elasticPolicy.maxRestarts (-2) must be >= 0",
        "spec.module is required: set exactly one of spec.module or spec.script",
    ]


def test_field_and_cross_field_errors_are_reported_together_in_one_run():
    errors = validate_spec(spec_with({
        "image": "", "imagePullPolicy": "Sometimes", "script": "/w/train.py",
        "elasticPolicy": {"minReplicas": 3, "maxReplicas": 2, "maxRestarts": -1, "rdzvBackend": "etcd"},
        "failurePolicy": {"backoffSeconds": 10, "maxBackoffSeconds": 1},
        "env": [{"name": "PET_NNODES", "value": "1"}],
    }))
    assert [e.message for e in errors] == [
        'spec.image ("") must not be empty',
        "spec.imagePullPolicy (\"Sometimes\") must be one of 'Always', 'IfNotPresent' or 'Never'",
        "spec.elasticPolicy.maxRestarts (-1) must be >= 0",
        'spec.script ("/w/train.py") may not be set together with spec.module ("ddpjob_trainer.examples.mlp"): '
        "set exactly one of them",
        "spec.elasticPolicy.maxReplicas (2) must be >= spec.elasticPolicy.minReplicas (3)",
        "spec.replicas (2) must be >= spec.elasticPolicy.minReplicas (3)",
        "spec.elasticPolicy.rdzvEndpoints ([]) must list at least one etcd host:port when rdzvBackend is etcd "
        "(or set managedEtcd.enabled: true)",
        "spec.failurePolicy.maxBackoffSeconds (1) must be >= spec.failurePolicy.backoffSeconds (10)",
        'spec.env[0].name ("PET_NNODES") is set by the operator; use spec.elasticPolicy.minReplicas/maxReplicas '
        "instead",
    ]


@pytest.mark.parametrize("changes, message", [
    # minReplicas refused: judged on its default, "maxReplicas >= minReplicas" would be a guess
    ({"replicas": 2, "elasticPolicy": {"minReplicas": "3", "maxReplicas": 2}},
     'spec.elasticPolicy.minReplicas ("3") must be an integer'),
    # resources refused: whether nProcPerNode gpu has its GPU limit cannot be known
    ({"resources": {"limits": "lots"}, "elasticPolicy": {"nProcPerNode": "gpu"}},
     'spec.resources.limits ("lots") must be a mapping (an object)'),
    # one env entry refused: the duplicate-name rule would judge a list the file does not have
    ({"env": [{"name": "A", "value": "1"}, {"name": "A", "value": 2}]}, "spec.env[1].value (2) must be a string"),
])
def test_a_cross_field_rule_that_reads_a_refused_field_says_nothing(changes, message):
    assert [e.message for e in validate_spec(spec_with(changes))] == [message]


def test_a_misspelt_field_holds_back_the_rules_reading_the_field_it_meant_only():
    # minReplicas holds its default (replicas, 6), not the 2 the file meant: "maxReplicas (4) must be >=
    # minReplicas (6)" would be false; replicas above maxReplicas reads neither and is reported.
    errors = validate_spec(spec_with({"replicas": 6, "elasticPolicy": {"minReplica": 2, "maxReplicas": 4}}))
    assert [e.message for e in errors] == [
        "spec.elasticPolicy.minReplica (2) is not a field of this object: did you mean 'minReplicas'?",
        "spec.replicas (6) must be <= spec.elasticPolicy.maxReplicas (4)",
    ]


def test_collecting_every_error_leaves_the_callers_spec_as_it_was():
    spec = spec_with({"image": "", "elasticPolicy": {"minReplica": 2, "maxRestarts": -1}, "env": [{"name": 3}]})
    before = copy.deepcopy(spec)
    assert len(validate_spec(spec)) == 4
    assert spec == before


def test_a_refused_replicas_leaves_the_explicit_min_max_rule_running():
    errors = validate_spec(spec_with({"replicas": "x", "elasticPolicy": {"minReplicas": 3, "maxReplicas": 2}}))
    assert [e.message for e in errors] == [
        'spec.replicas ("x") must be an integer',
        "spec.elasticPolicy.maxReplicas (2) must be >= spec.elasticPolicy.minReplicas (3)",
    ]


@pytest.mark.parametrize("changes, message", [
    ({"elasticPolicy": {"minReplica": 1}},
     "spec.elasticPolicy.minReplica (1) is not a field of this object: did you mean 'minReplicas'?"),
    ({"imag": "x"}, 'spec.imag ("x") is not a field of this object: did you mean \'image\'?'),
    ({"env": [{"name": "A", "valu": "1"}]},
     'spec.env[0].valu ("1") is not a field of this object: did you mean \'value\'?'),
    ({"zzzz": 1}, "spec.zzzz (1) is not a field of this object (check the spelling)"),
    # too long to be a misspelling of any field: not compared at all (difflib would index all of it)
    ({"image" * 40: 1}, f"spec.{'image' * 40} (1) is not a field of this object (check the spelling)"),
])
def test_a_misspelt_field_gets_the_closest_field_name_of_its_object(changes, message):
    assert [e.message for e in validate_spec(spec_with(changes))] == [message]


def test_parse_spec_raises_an_error_carrying_every_field_error():
    with pytest.raises(InvalidSpecError) as caught:
        parse_spec(spec_with({"image": "", "replicas": 0}))
    assert [e.path for e in caught.value.errors] == ["spec.replicas", "spec.image"]
    assert str(caught.value) == (
        "invalid DDPJob: spec.replicas (0) must be >= 1; spec.image (\"\") must not be empty")


def test_field_error_message_without_a_value_omits_the_parentheses():
    assert FieldError("spec.image", object(), "x").message.startswith("spec.image (")
    from ddpjob_operator.api.validation import MISSING
    assert FieldError("spec.image", MISSING, "is required").message == "spec.image is required"


# (given replicas/min/max, resolved replicas/min/max)
REPLICA_DEFAULTS = [
    ((None, None, None), (1, 1, 1)),
    ((3, None, None), (3, 3, 3)),
    ((None, 2, 8), (2, 2, 8)),
    ((4, 2, 8), (4, 2, 8)),
    ((None, 2, None), (2, 2, 2)),
    ((5, 2, None), (5, 2, 5)),
    ((None, None, 4), (1, 1, 4)),
    ((3, None, 6), (3, 3, 6)),
]


@pytest.mark.parametrize("given,resolved", REPLICA_DEFAULTS)
def test_replica_defaults_resolve_from_each_other(given, resolved):
    replicas, lo, hi = given
    spec = parse_spec(make_spec(replicas=replicas, min_replicas=lo, max_replicas=hi))
    assert (spec.desired_replicas, spec.min_replicas, spec.max_replicas) == resolved


def test_defaults_of_a_minimal_spec_are_documented_values():
    spec = parse_spec({"image": "img", "module": "m"})
    ep, fp, rp = spec.elastic_policy, spec.failure_policy, spec.run_policy
    assert (ep.n_proc_per_node, ep.max_restarts, ep.rdzv_backend, ep.rdzv_port) == ("auto", 3, "c10d", 29400)
    assert ep.rdzv_timeouts.model_dump(by_alias=True) == {
        "joinSeconds": 600, "lastCallSeconds": 30, "closeSeconds": 30,
        "keepAliveIntervalSeconds": 5, "keepAliveMaxAttempts": 3}
    assert (fp.max_restarts, fp.backoff_seconds, fp.max_backoff_seconds, fp.permanent_exit_codes) == (
        5, 10, 300, [126, 127])
    assert (rp.suspend, rp.active_deadline_seconds, rp.ttl_seconds_after_finished, rp.clean_pod_policy) == (
        False, None, None, "Running")
    assert spec.snapshot is None and spec.image_pull_policy == "IfNotPresent"


def test_an_empty_snapshot_object_means_an_emptydir_at_slash_snapshots():
    snap = parse_spec(make_spec(snapshot={})).snapshot
    assert (snap.mount_path, snap.volume, snap.keep) == ("/snapshots", {"emptyDir": {}}, 2)


def test_fields_accept_snake_case_names_too():
    spec = DDPJobSpec.model_validate({"image": "i", "module": "m", "elastic_policy": {"min_replicas": 2}})
    assert spec.min_replicas == 2


def test_the_brief_example_spec_is_valid():
    spec = parse_spec({
        "replicas": 2, "image": "ghcr.io/ddpjob/trainer:0.1.0", "imagePullPolicy": "IfNotPresent",
        "module": "ddpjob_trainer.examples.mlp", "args": ["--epochs", "5"], "env": [{"name": "FOO", "value": "bar"}],
        "resources": {"limits": {"nvidia.com/gpu": 1, "cpu": "4", "memory": "16Gi"}},
        "elasticPolicy": {"minReplicas": 1, "maxReplicas": 4, "nProcPerNode": "auto", "maxRestarts": 3,
                          "rdzvBackend": "c10d", "rdzvPort": 29400, "rdzvEndpoints": [],
                          "rdzvTimeouts": {"joinSeconds": 600, "lastCallSeconds": 30, "closeSeconds": 30,
                                           "keepAliveIntervalSeconds": 5, "keepAliveMaxAttempts": 3}},
        "snapshot": {"mountPath": "/snapshots", "volume": {"persistentVolumeClaim": {"claimName": "mlp-snapshots"}},
                     "keep": 2},
        "failurePolicy": {"maxRestarts": 5, "backoffSeconds": 10, "maxBackoffSeconds": 300,
                          "permanentExitCodes": [126, 127]},
        "runPolicy": {"suspend": False, "activeDeadlineSeconds": None, "ttlSecondsAfterFinished": None,
                      "cleanPodPolicy": "Running"},
        "scheduling": {"nodeSelector": {}, "tolerations": [], "affinity": {}, "priorityClassName": "",
                       "schedulerName": ""},
        "podOverrides": {"serviceAccountName": "", "imagePullSecrets": [], "securityContext": {}, "volumes": [],
                         "volumeMounts": [], "labels": {}, "annotations": {}},
    })
    assert (spec.desired_replicas, spec.min_replicas, spec.max_replicas) == (2, 1, 4)


def test_user_env_may_override_tuning_variables():
    assert validate_spec(make_spec(env=[{"name": "PYTHONUNBUFFERED", "value": "0"}])) == []


def test_a_job_name_too_long_for_its_pod_names_is_rejected_with_the_limit():
    body = make_ddpjob("a" * 56, replicas=2, max_replicas=12)
    assert [e.message for e in validate_job(body)] == [
        f'metadata.name ("{"a" * 56}") is too long: pod name \'{"a" * 56}-node-11\' has 64 characters, '
        "over the DNS label limit of 63; use at most 55 characters"]


def test_a_job_name_too_long_is_reported_with_field_errors_elsewhere_in_the_spec():
    body = make_ddpjob("a" * 56, replicas=2, max_replicas=12, imagePullPolicy="Sometimes")
    assert [e.path for e in validate_job(body)] == ["metadata.name", "spec.imagePullPolicy"]


def test_a_job_name_that_just_fits_is_accepted():
    assert validate_job(make_ddpjob("a" * 55, replicas=2, max_replicas=12)) == []


def test_parse_job_returns_identity_and_spec():
    ref, spec = parse_job(make_ddpjob("mlp", namespace="team", uid="u1", generation=4, replicas=3))
    assert ref == JobRef("mlp", "team", "u1", 4) and spec.desired_replicas == 3


@pytest.mark.parametrize("elastic, store_on_pod", [
    ({}, True),  # c10d without rdzvStore: the store pod is the default
    ({"rdzvStore": "pod"}, True),
    ({"rdzvStore": "node"}, False),
    ({"rdzvBackend": "etcd-v3", "rdzvEndpoints": ["e:1"]}, False),  # etcd keeps the state: no store pod
    ({"rdzvBackend": "etcd", "rdzvEndpoints": ["e:1"]}, False),
])
def test_c10d_jobs_get_a_store_pod_unless_rdzv_store_is_node(elastic, store_on_pod):
    spec = parse_spec(make_spec(elasticPolicy=elastic))
    assert validate_spec(make_spec(elasticPolicy=elastic)) == []
    assert spec.elastic_policy.store_on_pod is store_on_pod


@pytest.mark.parametrize("fields", [
    {"replicas": 1000},  # the cap itself
    {"env": [{"name": "my.var-1", "value": "x"}, {"name": "_X", "value": "y"}]},
    {"podOverrides": {"labels": {"example.com/team": "a", "tier": ""},
                      "annotations": {"example.com/note": "any text: spaces, / and all"}}},
    {"scheduling": {"nodeSelector": {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}}},
    {"resources": {"limits": {"cpu": "4", "memory": "16Gi", "hugepages-2Mi": "1Gi", "nvidia.com/gpu": 1},
                   "requests": {"cpu": "4000m", "memory": "16384Mi"}}},  # equal to the limits, other units
    {"resources": {"requests": {"cpu": "+1.5"}}},  # a request without a limit
    {"snapshot": {"mountPath": "/..data/.cache"}, "podOverrides": {  # dot-led names are not . or ..
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "c"}}],
        "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": True},
                         {"name": "snapshots", "mountPath": "/also/snapshots"},  # the operator's volumes may be
                         {"name": "dshm", "mountPath": "/shm2"}]}},  # mounted again elsewhere
])
def test_valid_edges_of_the_new_rules_are_accepted(fields):
    assert validate_spec(make_spec(**fields)) == []


def test_the_size_limit_is_the_compact_json_size_in_bytes():
    def job(padding: int) -> dict:
        body = make_ddpjob(args=[""])
        body["spec"]["args"] = ["é" * padding]  # two UTF-8 bytes each: bytes are counted, not characters
        return body
    import json
    size = len(json.dumps(job(0), separators=(",", ":"), ensure_ascii=False).encode())
    fits = job((OBJECT_SIZE_LIMIT - size) // 2)
    assert len(json.dumps(fits, separators=(",", ":"), ensure_ascii=False).encode()) in (
        OBJECT_SIZE_LIMIT, OBJECT_SIZE_LIMIT - 1)
    assert document_errors(fits) == []
    fits["spec"]["args"][0] += "éé"
    assert [e.path for e in document_errors(fits)] == ["DDPJob"]


def test_a_yaml_alias_cycle_is_reported_as_too_deep_not_a_recursion_error():
    body = make_ddpjob()
    loop: dict = {}
    loop["again"] = loop
    body["spec"]["podOverrides"] = {"securityContext": loop}
    assert [e.message for e in validate_job(body)] == [
        f"spec.podOverrides.securityContext.again.again.again... is nested more than {MAX_DEPTH} levels deep: "
        "no DDPJob field is deeper than 12, so the document is broken"]


def test_an_alias_bomb_is_stopped_at_the_size_limit_without_expanding_it():
    import time
    bomb: list = ["x" * 100]
    for _ in range(9):
        bomb = [bomb] * 10  # what `&a [*b, *b, ...]` nine times gives: 10**9 strings once expanded
    body = make_ddpjob()
    body["spec"]["args"] = bomb
    start = time.monotonic()
    assert [e.path for e in validate_job(body)] == ["DDPJob"]
    assert time.monotonic() - start < 5


def test_integers_are_strict_like_the_api_servers_schema():
    assert [e.message for e in validate_spec(make_spec(replicas=2.0, elasticPolicy={"maxRestarts": False}))] == [
        "spec.replicas (2.0) must be an integer", "spec.elasticPolicy.maxRestarts (false) must be an integer"]


def test_a_long_name_is_reported_even_when_the_spec_is_invalid_too():
    body = make_ddpjob("a" * 60, replicas=0)
    assert [e.path for e in validate_job(body)] == ["metadata.name", "spec.replicas"]


def test_validate_job_refuses_a_body_that_is_not_a_mapping():
    assert [e.message for e in validate_job(["mlp"])] == [
        'DDPJob (["mlp"]) must be a mapping (an object) with apiVersion, kind, metadata and spec']
