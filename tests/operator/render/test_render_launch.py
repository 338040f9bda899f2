"""The launch plan: torchrun configured through PET_* variables, the same for pods and local runs."""

from __future__ import annotations

import pytest

from ddpjob_operator.render.launch import UnsupportedLocalEnvError, launch_plan, merged_env, rdzv_conf
from ddpjob_operator.api.job_ref import JobRef
from ddpjob_operator.api.spec import RdzvTimeouts
from ddpjob_operator.api.validation import InvalidSpecError, parse_spec
from ddpjob_operator.render.node_pod import render_pod
from ddpjob_trainer.env import snapshot_on_unreadable
from ddpjob_sandbox.jobs import make_spec


def plan(spec_fields=None, **kw):
    spec = parse_spec(make_spec(**(spec_fields or {})))
    args = dict(job="mlp", namespace="ns", uid="uid-1", spec=spec, node_index=1, rdzv_host="127.0.0.1",
                snapshot_dir="/tmp/snaps")
    args.update(kw)
    return launch_plan(**args)


def test_local_launch_of_a_c10d_job():
    launch = plan({"replicas": 2, "min_replicas": 1, "max_replicas": 3, "args": ["--epochs", "2"]})
    assert launch.command == ["torchrun"]
    assert launch.args == ["-m", "ddpjob_trainer.examples.mlp", "--epochs", "2"]
    assert launch.env == {
        "PET_NNODES": "1:3",
        "PET_NPROC_PER_NODE": "1",
        "PET_RDZV_BACKEND": "c10d",
        "PET_RDZV_ENDPOINT": "127.0.0.1:29400",
        "PET_RDZV_ID": "uid-1",
        "PET_RDZV_CONF": "join_timeout=600,last_call_timeout=30,close_timeout=30,"
                         "keep_alive_interval=5,keep_alive_max_attempt=3,is_host=false",
        "PET_MAX_RESTARTS": "3",
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        "PYTHONUNBUFFERED": "1",
        "DDPJOB_JOB_NAME": "mlp",
        "DDPJOB_NAMESPACE": "ns",
        "DDPJOB_JOB_UID": "uid-1",
        "DDPJOB_NODE_INDEX": "1",
        "DDPJOB_COLLECTIVE_TIMEOUT_SECONDS": "300",
        "DDPJOB_SNAPSHOT_DIR": "/tmp/snaps",
        "DDPJOB_SNAPSHOT_ON_UNREADABLE": "Fail",
    }


def test_etcd_v3_uses_all_endpoints_and_ignores_the_rdzv_host():
    launch = plan({"elasticPolicy": {"rdzvBackend": "etcd-v3", "rdzvEndpoints": ["e1:2379", "e2:2379"]}})
    assert (launch.env["PET_RDZV_BACKEND"], launch.env["PET_RDZV_ENDPOINT"]) == ("etcd-v3", "e1:2379,e2:2379")


@pytest.mark.parametrize("rdzv_store, hosts", [("node", ["true", "false", "false"]),
                                               ("pod", ["false", "false", "false"]),
                                               (None, ["false", "false", "false"])])
def test_only_node_0_hosts_the_c10d_store_unless_a_store_pod_does(rdzv_store, hosts):
    # Said explicitly: on one host (ddpjob run, hostNetwork) torch would let any agent host it.
    fields = {"replicas": 3, "elasticPolicy": {"rdzvStore": rdzv_store} if rdzv_store else {}}
    confs = [plan(fields, node_index=i).env["PET_RDZV_CONF"] for i in range(3)]
    assert [conf.split("is_host=")[1] for conf in confs] == hosts


def test_etcd_backends_have_no_store_host():
    launch = plan({"elasticPolicy": {"rdzvBackend": "etcd-v3", "rdzvEndpoints": ["e1:2379"]}}, node_index=0)
    assert "is_host" not in launch.env["PET_RDZV_CONF"]


def test_torchs_v2_etcd_backend_also_gets_its_own_join_timeout_key():
    assert rdzv_conf("etcd", RdzvTimeouts(join_seconds=60)).endswith(",timeout=60")
    assert "timeout=60" not in rdzv_conf("c10d", RdzvTimeouts(join_seconds=60)).split(",")


def test_integer_nproc_per_node_and_torchrun_restarts_are_passed_as_strings():
    launch = plan({"elasticPolicy": {"nProcPerNode": 4, "maxRestarts": 0}})
    assert (launch.env["PET_NPROC_PER_NODE"], launch.env["PET_MAX_RESTARTS"]) == ("4", "0")


GPUS_4 = {"limits": {"nvidia.com/gpu": 4}}


@pytest.mark.parametrize("nproc, resources, workers", [
    ("auto", GPUS_4, "4"),  # one worker per GPU of the limit
    ("auto", {"limits": {"nvidia.com/gpu": "4", "cpu": "16"}}, "4"),  # GPUs win over CPUs
    ("auto", {"requests": {"cpu": "2"}}, "2"),
    ("auto", {"requests": {"cpu": 2}}, "2"),  # an integer quantity, as YAML gives `cpu: 2`
    ("auto", {"requests": {"cpu": "1500m"}}, "1"),  # whole CPUs, rounded down
    ("auto", {"requests": {"cpu": "500m"}}, "1"),  # less than one CPU still runs one worker
    ("auto", {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "2"}}, "1"),  # the request, not the limit
    ("auto", {"limits": {"cpu": "3"}}, "3"),  # the API server copies a lone limit into the request
    ("auto", {"limits": {"memory": "2Gi"}}, "1"),  # no CPU request: one worker, never one per host CPU
    ("auto", {}, "1"),
    ("auto", {"requests": {"cpu": "1e999999999"}}, "1"),  # not a number the API server takes: answered, no crash
    (3, {"requests": {"cpu": "8"}, **GPUS_4}, "3"),  # an explicit count is kept
    ("gpu", {"requests": {"cpu": "8"}, **GPUS_4}, "gpu"),  # torchrun counts the visible GPUs itself
])
def test_nproc_auto_resolves_to_the_gpu_limit_else_the_whole_cpus_requested(nproc, resources, workers):
    launch = plan({"elasticPolicy": {"nProcPerNode": nproc}, "resources": resources})
    assert launch.env["PET_NPROC_PER_NODE"] == workers


def test_the_pods_env_carries_the_resolved_count_never_torchruns_auto():
    # Checked on the Pod as rendered, which is what the kubelet (and the sandbox's node) runs.
    spec = parse_spec(make_spec(resources={"requests": {"cpu": "2"}}))
    (container,) = render_pod(JobRef(name="mlp", namespace="ns", uid="uid-1"), spec, 0)["spec"]["containers"]
    assert {e["name"]: e.get("value") for e in container["env"]}["PET_NPROC_PER_NODE"] == "2"


def test_no_snapshot_dir_means_no_snapshot_variable():
    env = plan(snapshot_dir=None).env
    assert "DDPJOB_SNAPSHOT_DIR" not in env and "DDPJOB_SNAPSHOT_ON_UNREADABLE" not in env


@pytest.mark.parametrize("snapshot, rendered", [({}, "Fail"), ({"onUnreadable": "StartOver"}, "StartOver")])
def test_the_unreadable_snapshot_policy_reaches_the_trainer(snapshot, rendered):
    env = plan({"snapshot": snapshot}).env
    assert env["DDPJOB_SNAPSHOT_ON_UNREADABLE"] == rendered
    # The trainer reads it under the same name and accepts every value the spec allows.
    assert snapshot_on_unreadable(env) == rendered


def test_the_unreadable_snapshot_policy_is_fail_or_start_over():
    with pytest.raises(InvalidSpecError) as raised:
        parse_spec(make_spec(snapshot={"onUnreadable": "Retry"}))
    assert str(raised.value) == ("invalid DDPJob: spec.snapshot.onUnreadable (\"Retry\") must be one of "
                                 "'Fail' or 'StartOver'")


def test_script_jobs_run_the_script_path():
    assert plan({"module": None, "script": "train.py", "args": ["-x"]}).args == ["train.py", "-x"]


def test_merged_env_applies_user_values_last():
    launch = plan()
    env = merged_env(launch, [{"name": "PYTHONUNBUFFERED", "value": "0"}, {"name": "FOO", "value": "bar"}])
    assert (env["PYTHONUNBUFFERED"], env["FOO"], env["PET_RDZV_ID"]) == ("0", "bar", "uid-1")


def test_merged_env_accepts_parsed_env_entries():
    spec = parse_spec(make_spec(env=[{"name": "FOO", "value": "bar"}]))
    assert merged_env(plan(), spec.env)["FOO"] == "bar"


def test_merged_env_refuses_value_from_because_only_a_cluster_resolves_it():
    with pytest.raises(UnsupportedLocalEnvError) as caught:
        merged_env(plan(), [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}])
    assert str(caught.value) == ("spec.env[0] (TOKEN) uses valueFrom, which only a cluster can resolve; "
                                 "give it a literal value for local runs")


@pytest.mark.parametrize("policy, conf", [
    ({"fastRestart": True, "replacementWaitSeconds": 30}, "replacement_wait=30"),
    ({"rdzvBackend": "etcd-v3", "rdzvEndpoints": ["e1:2379"], "replacementWaitSeconds": 5}, "replacement_wait=5"),
    ({"fastRestart": True, "replacementWaitSeconds": 0}, None),  # 0 is the handler's own default
    ({"replacementWaitSeconds": 30}, None),  # torch's c10d handler: nothing reads it
])
def test_the_replacement_wait_travels_in_the_rdzv_conf_where_ddpjobs_rendezvous_reads_it(policy, conf):
    items = plan({"elasticPolicy": policy}).env["PET_RDZV_CONF"].split(",")
    assert [item for item in items if item.startswith("replacement_wait=")] == ([conf] if conf else [])
