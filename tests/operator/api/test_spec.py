"""The spec model: defaults, and every rule reported with field, value and rule."""

from __future__ import annotations

import pytest

from ddpjob_operator.api.spec import (
    DDPJobSpec, FieldError, InvalidSpecError, JobRef, parse_job, parse_spec, validate_job, validate_spec
)
from ddpjob_sandbox.jobs import make_ddpjob, make_spec

# (test id, spec changes, exact messages) — the corpus of invalid specs; test_crd.py
# checks the same corpus against the generated openAPIV3Schema where a schema can tell.
INVALID_SPECS = [
    ("image missing", {"image": None}, ["spec.image is required"]),
    ("image empty", {"image": ""}, ['spec.image ("") must not be empty']),
    ("neither module nor script", {"module": None},
     ["spec.module is required: set exactly one of spec.module or spec.script"]),
    ("module and script", {"script": "/w/train.py"},
     ['spec.script ("/w/train.py") may not be set together with spec.module '
      '("ddpjob_trainer.examples.mlp"): set exactly one of them']),
    ("replicas zero", {"replicas": 0}, ["spec.replicas (0) must be >= 1"]),
    ("max below min", {"replicas": None, "elasticPolicy": {"minReplicas": 2, "maxReplicas": 1}},
     ["spec.elasticPolicy.maxReplicas (1) must be >= spec.elasticPolicy.minReplicas (2)"]),
    ("replicas below min", {"replicas": 1, "elasticPolicy": {"minReplicas": 2, "maxReplicas": 4}},
     ["spec.replicas (1) must be >= spec.elasticPolicy.minReplicas (2)"]),
    ("replicas above max", {"replicas": 5, "elasticPolicy": {"minReplicas": 1, "maxReplicas": 4}},
     ["spec.replicas (5) must be <= spec.elasticPolicy.maxReplicas (4)"]),
    ("unknown backend", {"elasticPolicy": {"rdzvBackend": "zookeeper"}},
     ["spec.elasticPolicy.rdzvBackend (\"zookeeper\") must be one of 'c10d', 'etcd' or 'etcd-v3'"]),
    ("etcd without endpoints", {"elasticPolicy": {"rdzvBackend": "etcd-v3"}},
     ["spec.elasticPolicy.rdzvEndpoints ([]) must list at least one etcd host:port "
      "when rdzvBackend is etcd-v3 (or set managedEtcd.enabled: true)"]),
    ("managed etcd with c10d", {"elasticPolicy": {"managedEtcd": {"enabled": True}}},
     ["spec.elasticPolicy.managedEtcd.enabled (true) needs rdzvBackend etcd or etcd-v3, not c10d: "
      "set rdzvBackend or remove managedEtcd"]),
    ("managed etcd with endpoints", {"elasticPolicy": {"rdzvBackend": "etcd-v3", "rdzvEndpoints": ["e:1"],
                                                       "managedEtcd": {"enabled": True}}},
     ['spec.elasticPolicy.rdzvEndpoints (["e:1"]) must be empty when managedEtcd.enabled is true (the '
      "operator points the nodes at its own etcd): remove one of them"]),
    ("managed etcd with a secret", {"elasticPolicy": {"rdzvBackend": "etcd-v3", "rdzvSecretName": "creds",
                                                      "managedEtcd": {"enabled": True}}},
     ['spec.elasticPolicy.rdzvSecretName ("creds") may not be set when managedEtcd.enabled is true: the '
      "managed etcd has no TLS or auth; use your own etcd with rdzvEndpoints for that"]),
    ("etcd v2 with two endpoints", {"elasticPolicy": {"rdzvBackend": "etcd", "rdzvEndpoints": ["a:1", "b:2"]}},
     ['spec.elasticPolicy.rdzvEndpoints (["a:1", "b:2"]) must have exactly one entry when '
      "rdzvBackend is etcd (torch's v2 backend takes one endpoint; etcd-v3 takes several)"]),
    ("rdzv secret with c10d", {"elasticPolicy": {"rdzvSecretName": "etcd-client"}},
     ['spec.elasticPolicy.rdzvSecretName ("etcd-client") may only be set when rdzvBackend is etcd or '
      "etcd-v3 (c10d has no etcd to authenticate to): remove it or change rdzvBackend"]),
    ("rdzv store pod with etcd", {"elasticPolicy": {"rdzvBackend": "etcd-v3", "rdzvEndpoints": ["e:1"],
                                                    "rdzvStore": "pod"}},
     ['spec.elasticPolicy.rdzvStore ("pod") may be pod only when rdzvBackend is c10d, not etcd-v3 (etcd '
      "backends keep their state in etcd): remove it or set rdzvBackend to c10d"]),
    ("queue name not a label value", {"scheduling": {"queueName": "team a"}},
     ['spec.scheduling.queueName ("team a") must match ^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$']),
    ("rdzv secret name not a DNS name", {"elasticPolicy": {"rdzvBackend": "etcd-v3", "rdzvEndpoints": ["e:1"],
                                                           "rdzvSecretName": "Etcd_Client"}},
     ['spec.elasticPolicy.rdzvSecretName ("Etcd_Client") must match ^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$']),
    ("c10d with endpoints", {"elasticPolicy": {"rdzvEndpoints": ["etcd:2379"]}},
     ['spec.elasticPolicy.rdzvEndpoints (["etcd:2379"]) must be empty when rdzvBackend is c10d '
      "(the operator points every node at node 0)"]),
    ("nproc word", {"elasticPolicy": {"nProcPerNode": "many"}},
     ['spec.elasticPolicy.nProcPerNode ("many") must be an integer >= 1, "gpu" or "auto"']),
    ("nproc zero", {"elasticPolicy": {"nProcPerNode": 0}},
     ['spec.elasticPolicy.nProcPerNode (0) must be an integer >= 1, "gpu" or "auto"']),
    ("nproc gpu without a gpu limit", {"elasticPolicy": {"nProcPerNode": "gpu"}},
     ['spec.elasticPolicy.nProcPerNode ("gpu") needs spec.resources.limits["nvidia.com/gpu"] (a GPU limit)']),
    ("port out of range", {"elasticPolicy": {"rdzvPort": 70000}},
     ["spec.elasticPolicy.rdzvPort (70000) must be <= 65535"]),
    ("bad quantity", {"resources": {"limits": {"memory": "lots"}}},
     ['spec.resources.limits.memory ("lots") must be a Kubernetes quantity such as 2, "500m" '
      'or "16Gi" (quote fractions)']),
    ("backoff cap below first delay", {"failurePolicy": {"backoffSeconds": 60, "maxBackoffSeconds": 30}},
     ["spec.failurePolicy.maxBackoffSeconds (30) must be >= spec.failurePolicy.backoffSeconds (60)"]),
    ("negative restart budget", {"failurePolicy": {"maxRestarts": -1}},
     ["spec.failurePolicy.maxRestarts (-1) must be >= 0"]),
    ("exit code zero is not permanent", {"failurePolicy": {"permanentExitCodes": [0]}},
     ["spec.failurePolicy.permanentExitCodes[0] (0) must be >= 1"]),
    ("unknown clean pod policy", {"runPolicy": {"cleanPodPolicy": "Some"}},
     ["spec.runPolicy.cleanPodPolicy (\"Some\") must be one of 'None', 'Running' or 'All'"]),
    ("relative snapshot path", {"snapshot": {"mountPath": "snapshots"}},
     ['spec.snapshot.mountPath ("snapshots") must match ^/']),
    ("snapshot volume with two sources", {"snapshot": {"volume": {"emptyDir": {}, "hostPath": {"path": "/x"}}}},
     ['spec.snapshot.volume ({"emptyDir": {}, "hostPath": {"path": "/x"}}) must have at most 1 entries']),
    ("misspelt field", {"elasticPolicy": {"minReplica": 1}},
     ["spec.elasticPolicy.minReplica (1) is not a field of this object (check the spelling)"]),
    ("reserved env", {"env": [{"name": "OK", "value": "1"}, {"name": "PET_NNODES", "value": "1:8"}]},
     ['spec.env[1].name ("PET_NNODES") is set by the operator; use '
      "spec.elasticPolicy.minReplicas/maxReplicas instead"]),
    ("reserved label", {"podOverrides": {"labels": {"ddpjob.io/node-index": "7"}}},
     ["spec.podOverrides.labels['ddpjob.io/node-index'] (\"7\") may not be set: the operator "
      "selects its pods by this label"]),
    ("reserved volume name", {"podOverrides": {"volumes": [{"name": "dshm", "emptyDir": {}}]}},
     ['spec.podOverrides.volumes[0].name ("dshm") is used by the operator; pick a name other '
      "than snapshots, dshm, rdzv-credentials"]),
    ("mount over /dev/shm", {"podOverrides": {"volumeMounts": [{"name": "x", "mountPath": "/dev/shm"}]}},
     ['spec.podOverrides.volumeMounts[0].mountPath ("/dev/shm") is already mounted by the operator '
      "(/dev/shm, spec.snapshot.mountPath or the rdzvSecretName mount /etc/ddpjob/rdzv)"]),
    ("mount over the rdzv secret", {"elasticPolicy": {"rdzvBackend": "etcd-v3", "rdzvEndpoints": ["e:1"],
                                                      "rdzvSecretName": "etcd-client"},
                                    "podOverrides": {"volumeMounts": [{"name": "x", "mountPath": "/etc/ddpjob/rdzv"}]}},
     ['spec.podOverrides.volumeMounts[0].mountPath ("/etc/ddpjob/rdzv") is already mounted by the operator '
      "(/dev/shm, spec.snapshot.mountPath or the rdzvSecretName mount /etc/ddpjob/rdzv)"]),
    ("negative deadline", {"runPolicy": {"activeDeadlineSeconds": 0}},
     ["spec.runPolicy.activeDeadlineSeconds (0) must be >= 1"]),
]


def spec_with(changes: dict) -> dict:
    """make_spec() with `changes` applied; a None value removes the field."""
    spec = make_spec()
    for key, value in changes.items():
        if value is None:
            spec.pop(key, None)
        else:
            spec[key] = value
    return spec


@pytest.mark.parametrize("changes,messages", [c[1:] for c in INVALID_SPECS], ids=[c[0] for c in INVALID_SPECS])
def test_each_invalid_spec_is_rejected_with_a_message_naming_field_value_and_rule(changes, messages):
    errors = validate_spec(spec_with(changes))
    assert [e.message for e in errors] == messages


def test_the_corpus_has_at_least_ten_invalid_specs():
    assert len(INVALID_SPECS) >= 10


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
    ]


def test_parse_spec_raises_an_error_carrying_every_field_error():
    with pytest.raises(InvalidSpecError) as caught:
        parse_spec(spec_with({"image": "", "replicas": 0}))
    assert [e.path for e in caught.value.errors] == ["spec.replicas", "spec.image"]
    assert str(caught.value) == (
        "invalid DDPJob: spec.replicas (0) must be >= 1; spec.image (\"\") must not be empty")


def test_field_error_message_without_a_value_omits_the_parentheses():
    assert FieldError("spec.image", object(), "x").message.startswith("spec.image (")
    from ddpjob_operator.api.spec import MISSING
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
