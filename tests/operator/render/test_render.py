"""Rendered Service and Pods: golden YAML for the full shape, small tests for each rule."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
import yaml

from ddpjob_operator.api import constants as C
from ddpjob_operator.render.node_pod import render_pod, render_service
from ddpjob_operator.render.common import selector
from ddpjob_operator.render.store_pod import render_store_pod
from ddpjob_operator.api.job_ref import JobRef
from ddpjob_operator.api.validation import parse_spec
from ddpjob_sandbox.jobs import make_spec

GOLDEN = Path(__file__).parents[1] / "golden"
REF = JobRef(name="mlp", namespace="team-a", uid="6f1c2a9e-0000-4000-8000-000000000001", generation=1)


def assert_golden(name: str, obj: dict) -> None:
    """Compare `obj` as YAML with golden/<name>; DDPJOB_UPDATE_GOLDEN=1 rewrites the file."""
    text = yaml.safe_dump(obj, sort_keys=False, width=100)
    path = GOLDEN / name
    if os.environ.get("DDPJOB_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert text == path.read_text(), f"{path} differs; see golden/README.md to regenerate"


def full_spec():
    """A spec that uses every part of the pod template."""
    return parse_spec(make_spec(
        replicas=2, min_replicas=1, max_replicas=4,
        args=["--epochs", "5"],
        env=[{"name": "FOO", "value": "bar"},
             {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "hub", "key": "token"}}}],
        resources={"limits": {"nvidia.com/gpu": 1, "cpu": "4", "memory": "16Gi"}},
        elasticPolicy={"nProcPerNode": "gpu", "rdzvTimeouts": {"lastCallSeconds": 3, "keepAliveIntervalSeconds": 2},
                       "fastRestart": True},
        snapshot={"volume": {"persistentVolumeClaim": {"claimName": "mlp-snapshots"}}},
        scheduling={"nodeSelector": {"gpu": "h100"}, "tolerations": [{"key": "gpu", "operator": "Exists"}],
                    "priorityClassName": "training"},
        podOverrides={"serviceAccountName": "trainer", "imagePullSecrets": [{"name": "ghcr"}],
                      "securityContext": {"runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000},
                      "containerSecurityContext": {"readOnlyRootFilesystem": True},
                      "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "imagenet"}}],
                      "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": True}],
                      "labels": {"team": "vision"}, "annotations": {"owner": "ana"}},
    ))


def test_service_matches_golden_yaml():
    assert_golden("service.yaml", render_service(REF, full_spec()))


def test_pod_matches_golden_yaml():
    assert_golden("pod.yaml", render_pod(REF, full_spec(), 1))


def test_service_is_headless_and_publishes_not_ready_pods_on_the_rdzv_port():
    svc = render_service(REF, parse_spec(make_spec(elasticPolicy={"rdzvPort": 29500})))["spec"]
    assert svc["clusterIP"] == "None" and svc["publishNotReadyAddresses"] is True
    assert svc["selector"] == {C.LABEL_JOB_NAME: "mlp", C.LABEL_COMPONENT: "node"}
    assert svc["ports"] == [{"name": "rdzv", "port": 29500, "targetPort": 29500, "protocol": "TCP"}]


def test_pod_dns_name_comes_from_hostname_and_the_service_subdomain():
    pod = render_pod(REF, parse_spec(make_spec()), 3)
    assert (pod["metadata"]["name"], pod["spec"]["hostname"], pod["spec"]["subdomain"]) == (
        "mlp-node-3", "mlp-node-3", "mlp")


def test_pod_is_owned_and_controlled_by_its_job():
    (owner,) = render_pod(REF, parse_spec(make_spec()), 0)["metadata"]["ownerReferences"]
    assert owner == {"apiVersion": "ddpjob.io/v1alpha1", "kind": "DDPJob", "name": "mlp",
                     "uid": REF.uid, "controller": True, "blockOwnerDeletion": True}


def test_pod_labels_carry_job_and_node_index_and_the_selector_matches_them():
    labels = render_pod(REF, parse_spec(make_spec()), 2)["metadata"]["labels"]
    assert labels[C.LABEL_JOB_NAME] == "mlp" and labels[C.LABEL_NODE_INDEX] == "2"
    assert labels[C.LABEL_COMPONENT] == "node" and labels[C.LABEL_MANAGED_BY] == "ddpjob-operator"
    wanted = dict(pair.split("=") for pair in selector("mlp").split(","))
    assert wanted == {C.LABEL_JOB_NAME: "mlp", C.LABEL_COMPONENT: "node"}
    assert {key: labels[key] for key in wanted} == wanted


def test_the_scale_selector_leaves_the_rendezvous_store_pod_out():
    store = render_store_pod(REF, parse_spec(make_spec()))["metadata"]["labels"]
    wanted = dict(pair.split("=") for pair in selector("mlp").split(","))
    assert any(store.get(key) != value for key, value in wanted.items())


def test_pod_never_restarts_in_place_because_the_operator_replaces_it():
    assert render_pod(REF, parse_spec(make_spec()), 0)["spec"]["restartPolicy"] == "Never"


def test_module_runs_as_torchrun_dash_m_and_script_as_its_path():
    module_pod = render_pod(REF, parse_spec(make_spec(args=["--epochs", "1"])), 0)
    script_pod = render_pod(REF, parse_spec(make_spec(module=None, script="/w/train.py")), 0)
    (mc,), (sc,) = module_pod["spec"]["containers"], script_pod["spec"]["containers"]
    assert (mc["command"], mc["args"]) == (["torchrun"], ["-m", "ddpjob_trainer.examples.mlp", "--epochs", "1"])
    assert (sc["command"], sc["args"]) == (["torchrun"], ["/w/train.py"])


def test_dev_shm_is_a_memory_volume_and_the_snapshot_volume_is_mounted_at_mount_path():
    pod = render_pod(REF, parse_spec(make_spec(snapshot={"mountPath": "/ckpt"})), 0)
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert volumes["dshm"] == {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}}
    assert volumes["snapshots"] == {"name": "snapshots", "emptyDir": {}}
    assert mounts == {"snapshots": "/ckpt", "dshm": "/dev/shm"}


def test_jobs_sharing_a_claim_each_mount_their_own_directory_of_it():
    """Mounted at its root, two jobs on one claim resumed from each other's snapshots and pruned them."""
    spec = parse_spec(make_spec(snapshot={"volume": {"persistentVolumeClaim": {"claimName": "team"}}}))
    subpaths = set()
    for name in ("pretrain", "finetune"):
        pod = render_pod(dataclasses.replace(REF, name=name), spec, 0)
        (snapshot_mount,) = [m for m in pod["spec"]["containers"][0]["volumeMounts"] if m["name"] == "snapshots"]
        assert snapshot_mount["mountPath"] == "/snapshots"
        subpaths.add(snapshot_mount["subPath"])
    assert subpaths == {"pretrain", "finetune"}


@pytest.mark.parametrize("limits,size,expected", [
    ({}, None, "8Gi"),  # no memory limit: SHM_WITHOUT_LIMIT
    ({"memory": "16Gi"}, None, "8Gi"),  # half the limit
    ({"memory": "3Gi"}, None, "1536Mi"),
    ({"memory": 17179869184}, None, "8Gi"),  # a limit written as plain bytes
    ({"memory": "1G"}, None, "476Mi"),  # half of 10^9 bytes, rounded down to whole MiB
    ({"memory": "300Mi"}, None, "256Mi"),  # half is 150Mi: the floor
    ({"memory": "128Mi"}, None, "128Mi"),  # the floor never goes above the limit
    ({"memory": "16Gi"}, "2Gi", "2Gi"),  # spec.sharedMemorySize wins
    ({}, "32Gi", "32Gi"),
], ids=["no limit", "16Gi", "3Gi", "bytes", "decimal", "floor", "below floor", "set", "set without limit"])
def test_dev_shm_size_limit_is_half_the_memory_limit_unless_the_spec_sets_it(limits, size, expected):
    fields = {"resources": {"limits": limits}, **({"sharedMemorySize": size} if size else {})}
    (shm,) = [v for v in render_pod(REF, parse_spec(make_spec(**fields)), 0)["spec"]["volumes"] if v["name"] == "dshm"]
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": expected}


def test_without_a_service_account_no_token_is_mounted_in_node_or_store_pods():
    spec = parse_spec(make_spec())
    for pod in (render_pod(REF, spec, 0), render_store_pod(REF, spec)):
        assert pod["spec"]["automountServiceAccountToken"] is False
        assert "serviceAccountName" not in pod["spec"]


def test_a_service_account_set_by_the_user_decides_about_its_token_itself():
    spec = parse_spec(make_spec(podOverrides={"serviceAccountName": "trainer"}))
    for pod in (render_pod(REF, spec, 0), render_store_pod(REF, spec)):
        assert pod["spec"]["serviceAccountName"] == "trainer"
        assert "automountServiceAccountToken" not in pod["spec"]


def test_node_pods_run_as_the_image_uid_with_seccomp_and_no_privileges_by_default():
    pod = render_pod(REF, parse_spec(make_spec()), 0)["spec"]
    assert pod["securityContext"] == {
        "runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532, "fsGroup": 65532,
        "seccompProfile": {"type": "RuntimeDefault"}, "fsGroupChangePolicy": "OnRootMismatch"}
    assert pod["containers"][0]["securityContext"] == {"allowPrivilegeEscalation": False,
                                                       "capabilities": {"drop": ["ALL"]}}


def test_security_overrides_replace_only_the_fields_they_set():
    spec = parse_spec(make_spec(podOverrides={
        "securityContext": {"runAsUser": 1000, "seccompProfile": {"type": "Localhost", "localhostProfile": "p.json"}},
        "containerSecurityContext": {"capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]},
                                     "readOnlyRootFilesystem": True}}))
    pod = render_pod(REF, spec, 0)["spec"]
    assert pod["securityContext"] == {
        "runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 65532, "fsGroup": 65532,
        "seccompProfile": {"type": "Localhost", "localhostProfile": "p.json"}, "fsGroupChangePolicy": "OnRootMismatch"}
    assert pod["containers"][0]["securityContext"] == {
        "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]},
        "readOnlyRootFilesystem": True}


def test_the_store_pod_runs_as_the_nodes_but_keeps_its_read_only_container_defaults():
    spec = parse_spec(make_spec(podOverrides={"securityContext": {"runAsUser": 1000},
                                              "containerSecurityContext": {"readOnlyRootFilesystem": False}}))
    store = render_store_pod(REF, spec)["spec"]
    assert store["securityContext"] == render_pod(REF, spec, 0)["spec"]["securityContext"]
    assert store["containers"][0]["securityContext"] == {
        "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "readOnlyRootFilesystem": True}


def test_without_a_snapshot_there_is_no_snapshot_volume_or_variable():
    pod = render_pod(REF, parse_spec(make_spec()), 0)
    (container,) = pod["spec"]["containers"]
    assert [v["name"] for v in pod["spec"]["volumes"]] == ["dshm"]
    assert C.ENV_SNAPSHOT_DIR not in {e["name"] for e in container["env"]}


def test_user_env_replaces_an_operator_variable_of_the_same_name_once():
    spec = parse_spec(make_spec(env=[{"name": "PYTHONUNBUFFERED", "value": "0"}]))
    env = render_pod(REF, spec, 0)["spec"]["containers"][0]["env"]
    assert [e for e in env if e["name"] == "PYTHONUNBUFFERED"] == [{"name": "PYTHONUNBUFFERED", "value": "0"}]
    assert env[-1]["name"] == "PYTHONUNBUFFERED"


def test_etcd_pods_expose_no_rdzv_port_only_the_progress_endpoint_they_are_told_about():
    spec = parse_spec(make_spec(elasticPolicy={"rdzvBackend": "etcd-v3", "rdzvEndpoints": ["etcd:2379"]}))
    container = render_pod(REF, spec, 0)["spec"]["containers"][0]
    assert container["ports"] == [{"name": "progress", "containerPort": 29410, "protocol": "TCP"}]
    assert {"name": "DDPJOB_PROGRESS_PORT", "value": "29410"} in container["env"]


@pytest.mark.parametrize("field", ["nodeSelector", "tolerations", "affinity", "priorityClassName",
                                   "schedulerName", "serviceAccountName", "imagePullSecrets"])
def test_unset_scheduling_and_override_fields_are_left_to_the_cluster_defaults(field):
    assert field not in render_pod(REF, parse_spec(make_spec()), 0)["spec"]


def test_service_links_are_off_so_a_service_named_master_cannot_set_master_port():
    assert render_pod(REF, parse_spec(make_spec()), 0)["spec"]["enableServiceLinks"] is False


@pytest.mark.parametrize("render", [lambda s: render_service(REF, s), lambda s: render_pod(REF, s, 1)],
                         ids=["service", "pod"])
def test_rendered_objects_pass_the_kubernetes_schema_strictly(render):
    import kubernetes_validate

    kubernetes_validate.validate(render(full_spec()), "1.33", strict=True)
