"""The sandbox node's launch of a pod on this machine (pure: no API server): volumes and env
paths, cluster DNS names, the image's environment, what one machine cannot provide, the
termination message file; and which conditions a status write keeps. The cluster tier
(tests/cluster/test_kubelet.py, tests/cluster/sandbox/) runs pods for real."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ddpjob_sandbox.node.launch import UnsupportedPodError, container_launch, map_hosts
from ddpjob_sandbox.pod_status import keep_foreign_conditions

CLAIM = [{"name": "data", "persistentVolumeClaim": {"claimName": "shared"}}, {"name": "scratch", "emptyDir": {}}]
CLAIM_MOUNTS = [{"name": "data", "mountPath": "/data"}, {"name": "scratch", "mountPath": "/scratch"}]


def pod_object(*, env: dict | None = None, volumes: list | None = None, mounts: list | None = None) -> dict:
    """Pod ns/mlp-node-1 whose container runs ``python -c pass``."""
    container = {"name": "trainer", "image": "sandbox", "command": ["python", "-c", "pass"],
                 "env": [{"name": k, "value": v} for k, v in (env or {}).items()], "volumeMounts": mounts or []}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "mlp-node-1", "namespace": "ns", "uid": "u-1"},
            "spec": {"restartPolicy": "Never", "containers": [container], "volumes": volumes or []}}

def test_a_claim_is_one_shared_directory_and_env_paths_under_its_mount_move_there(tmp_path):
    pod = pod_object(env={"DDPJOB_SNAPSHOT_DIR": "/data", "OUT": "/data/run/metrics.jsonl", "TMP": "/scratch/x",
                          "OTHER": "/database"}, volumes=CLAIM, mounts=CLAIM_MOUNTS)
    launch = container_launch(pod, tmp_path, [], {"PATH": "/bin", "PET_NNODES": "9", "DDPJOB_JOB_NAME": "stale"})
    assert launch.env["DDPJOB_SNAPSHOT_DIR"] == str(tmp_path / "claims" / "ns" / "shared")
    assert launch.env["OUT"] == str(tmp_path / "claims" / "ns" / "shared" / "run" / "metrics.jsonl")
    assert launch.env["TMP"] == str(tmp_path / "pods" / "ns_mlp-node-1_u-1" / "volumes" / "scratch" / "x")
    assert launch.env["OTHER"] == "/database", "a path that only starts with the same letters is not under the mount"
    assert launch.env["PATH"] == "/bin" and "PET_NNODES" not in launch.env and "DDPJOB_JOB_NAME" not in launch.env


def test_cluster_dns_names_of_pods_and_services_resolve_to_loopback():
    assert map_hosts("mlp-node-0.mlp.ns.svc.cluster.local:29400", "ns", []) == "127.0.0.1:29400"
    assert map_hosts("etcd.infra.svc:2379,etcd-1.etcd.infra.svc.cluster.local:2379", "ns", []) == \
        "127.0.0.1:2379,127.0.0.1:2379"
    assert map_hosts("mlp-node-0.mlp:29400", "ns", ["mlp"]) == "127.0.0.1:29400"
    assert map_hosts("mlp-node-0.mlp.ns:29400", "ns", ["mlp"]) == "127.0.0.1:29400"
    assert map_hosts("example.com:443", "ns", ["mlp"]) == "example.com:443"
    assert map_hosts("ddpjob_trainer.examples.mlp", "ns", ["mlp"]) == "ddpjob_trainer.examples.mlp"


def test_torchrun_resolves_to_the_one_next_to_this_interpreter(tmp_path):
    pod = pod_object()
    pod["spec"]["containers"][0].update(command=["torchrun"], args=["-m", "ddpjob_trainer.examples.mlp"])
    launch = container_launch(pod, tmp_path, [], {})
    assert launch.argv == [str(Path(sys.executable).parent / "torchrun"), "-m", "ddpjob_trainer.examples.mlp"]


def test_an_image_the_node_maps_runs_in_its_environment_without_this_machines_python_path(tmp_path):
    image_env = tmp_path / "torch-only"
    (image_env / "bin").mkdir(parents=True)
    (image_env / "bin" / "torchrun").touch()
    pod = pod_object()
    pod["spec"]["containers"][0].update(image="pytorch/pytorch:2", command=["torchrun"], args=["/w/train.py"])
    machine = {"PATH": "/bin", "PYTHONPATH": "/repo/trainer", "VIRTUAL_ENV": "/repo/.venv", "HOME": "/root"}

    mapped = container_launch(pod, tmp_path, [], machine, {"pytorch/pytorch:2": image_env})
    assert mapped.argv == [str(image_env / "bin" / "torchrun"), "/w/train.py"]
    assert mapped.env["PATH"] == f"{image_env / 'bin'}:/bin" and mapped.env["HOME"] == "/root"
    assert "PYTHONPATH" not in mapped.env and "VIRTUAL_ENV" not in mapped.env
    other = container_launch(pod, tmp_path, [], machine, {"another/image:1": image_env})
    assert other.argv[0] == str(Path(sys.executable).parent / "torchrun") and other.env["PYTHONPATH"] == "/repo/trainer"


@pytest.mark.parametrize("change, message", [
    (lambda pod: pod["spec"]["volumes"].append({"name": "host", "hostPath": {"path": "/etc"}}),
     "volume 'host' is a hostPath; the sandbox node supports persistentVolumeClaim, emptyDir and projected"),
    (lambda pod: pod["spec"]["containers"][0]["env"].append({"name": "K", "valueFrom": {"secretKeyRef": {}}}),
     "env K uses valueFrom secretKeyRef; the sandbox node takes literal values and fieldRef only"),
    (lambda pod: pod["spec"]["containers"][0]["env"].append(
        {"name": "L", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['a']"}}}),
     r"env fieldRef.fieldPath \"metadata.labels\['a'\]\" is not provided by the sandbox node"),
    (lambda pod: pod["spec"]["containers"][0].update(command=["no-such-binary-here"]),
     'command "no-such-binary-here" is not found'),
])
def test_what_one_machine_cannot_provide_is_refused_by_name(tmp_path, change, message):
    pod = pod_object()
    change(pod)
    with pytest.raises(UnsupportedPodError, match=message):
        container_launch(pod, tmp_path, [], {})


def test_env_naming_the_termination_message_path_points_at_the_pods_own_file(tmp_path):
    launch = container_launch(pod_object(env={"DDPJOB_TERMINATION_LOG": "/dev/termination-log"}), tmp_path, [], {})
    assert launch.termination_log == tmp_path / "pods" / "ns_mlp-node-1_u-1" / "termination-log"
    assert launch.env["DDPJOB_TERMINATION_LOG"] == str(launch.termination_log)


def test_keep_foreign_conditions_keeps_a_disruption_target_and_replaces_the_kubelets_own():
    disruption = {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
    pod = {"status": {"conditions": [{"type": "Ready", "status": "True"}, disruption]}}
    body = {"status": {"phase": "Failed", "conditions": [{"type": "Ready", "status": "False"}]}}
    assert keep_foreign_conditions(body, pod)["status"]["conditions"] == [
        {"type": "Ready", "status": "False"}, disruption]
    assert keep_foreign_conditions({"status": {"phase": "Running"}}, pod) == {"status": {"phase": "Running"}}
