"""The local launch plan: the Pods' command and environment, moved onto this machine."""
import tempfile
from pathlib import Path

import pytest

from ddpjob_operator.render.launch import UnsupportedLocalEnvError
from ddpjob_operator.local.plan import (
    FAST_RDZV_TIMEOUTS, LOOPBACK_ENV, fast_restart_installed, inherited_env, local_plan, local_runtime_dir,
    local_spec, localize,
)
from ddpjob_operator.render.launch import zygote_socket
from ddpjob_operator.render.node_pod import render_pod
from ddpjob_operator.api.job_ref import JobRef
from ddpjob_operator.api.validation import parse_spec
from ddpjob_operator.render.store_pod import render_store_pod
from ddpjob_sandbox.jobs import make_spec
from ddpjob_sandbox.node.launch import container_launch

RUN = Path("/tmp/run")
SNAP = RUN / "snapshots"


def spec_of(**fields):
    fields.setdefault("snapshot", {"mountPath": "/snapshots"})
    return parse_spec(make_spec(**fields))


@pytest.mark.parametrize("value, expected", [
    ("/snapshots", str(SNAP)),
    ("/snapshots/", str(SNAP)),
    ("/snapshots/metrics.jsonl", str(SNAP / "metrics.jsonl")),
    ("/snapshots/a/b", str(SNAP / "a" / "b")),
    ("/snapshots-old/x", "/snapshots-old/x"),  # a sibling with the same prefix is not under the mount
    ("/data/snapshots", "/data/snapshots"),
    ("snapshots", "snapshots"),
    ("--epochs", "--epochs"),
])
def test_localize_rewrites_paths_under_the_mount_path_only(value, expected):
    assert localize(value, "/snapshots", SNAP) == expected


def test_localize_keeps_values_when_the_job_has_no_snapshot_volume():
    assert localize("/snapshots/x", None, None) == "/snapshots/x"


def plan_of(spec, **kwargs):
    return local_plan("mlp", spec, rdzv_id="mlp-run-1", run_dir=RUN, torchrun="/venv/bin/torchrun", **kwargs)


def test_each_node_gets_the_pods_environment_with_only_the_local_differences():
    spec = spec_of(replicas=2, env=[{"name": "FOO", "value": "bar"}])
    plan = plan_of(spec, port=29555)
    ref = JobRef(name="mlp", namespace="team-a", uid="uid-1")
    for index, node in enumerate(plan.nodes):
        pod_env = {e["name"]: e.get("value") for e in render_pod(ref, spec, index)["spec"]["containers"][0]["env"]}
        differ = {k for k in node.env if pod_env.get(k) != node.env[k]}
        # Pod-only variables (the kubelet's termination log) are fine; a torchrun flag missing locally is not.
        assert not [k for k in set(pod_env) - set(node.env) if k.startswith("PET_")]
        assert differ == {"PET_RDZV_ENDPOINT", "PET_RDZV_ID", "PET_RDZV_CONF",
                          "PET_RDZV_BACKEND", "DDPJOB_SNAPSHOT_DIR", "DDPJOB_NAMESPACE", "DDPJOB_ZYGOTE_SOCKET",
                          "DDPJOB_JOB_UID", *LOOPBACK_ENV}
        assert node.env["PET_RDZV_ENDPOINT"] == "127.0.0.1:29555"
        assert node.env["PET_RDZV_ID"] == "mlp-run-1"
        assert node.env["DDPJOB_SNAPSHOT_DIR"] == str(SNAP)
        assert node.env["DDPJOB_NODE_INDEX"] == str(index) and node.env["FOO"] == "bar"
        assert node.env["DDPJOB_JOB_UID"] == "mlp-run-1"
        assert {k: node.env[k] for k in LOOPBACK_ENV} == {
            "DDPJOB_LISTEN_HOST": "127.0.0.1", "PET_LOCAL_ADDR": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo",
            "NCCL_SOCKET_IFNAME": "lo"}, "every listener of a local run on loopback"


@pytest.mark.parametrize("backend, fast, expected", [
    ("c10d", True, "ddpjob-c10d"),  # torch's c10d backend, re-rendezvous without waiting a last call
    ("c10d", False, "c10d"),  # ddpjob-trainer (its torchrun entry point) not installed beside ddpjob
    ("etcd-v3", True, "etcd-v3"),  # completes early by itself
])
def test_a_c10d_run_uses_the_early_rendezvous_with_fast_restart(backend, fast, expected):
    fields = {"elasticPolicy": {"rdzvBackend": backend, "rdzvEndpoints": ["e1:2379"]}} if backend != "c10d" else {}
    plan = plan_of(spec_of(replicas=2, **fields), fast_restart=fast)
    assert [node.env["PET_RDZV_BACKEND"] for node in plan.nodes] == [expected] * 2


def test_ddpjob_trainer_is_installed_in_this_environment():
    assert fast_restart_installed(), "pip install -e trainer registers the ddpjob-c10d torchrun handler"


def test_fast_restart_is_the_pods_rule_with_the_runs_rendezvous_id():
    spec = spec_of(replicas=2, args=["--epochs", "2"], elasticPolicy={"fastRestart": True})
    plan = plan_of(spec)
    ref = JobRef(name="mlp", namespace="team-a", uid="uid-1")
    for index, node in enumerate(plan.nodes):
        (pod,) = render_pod(ref, spec, index)["spec"]["containers"]
        pod_env = {e["name"]: e.get("value") for e in pod["env"]}
        assert node.argv[1:] == pod["args"] and node.env["PET_RDZV_BACKEND"] == pod_env["PET_RDZV_BACKEND"]
        assert pod_env["DDPJOB_ZYGOTE_SOCKET"] == zygote_socket("/run/ddpjob-zygote", "uid-1", index)
        assert node.env["DDPJOB_ZYGOTE_SOCKET"] == zygote_socket("/tmp", "mlp-run-1", index)


@pytest.mark.parametrize("field, argument, used, noted", [
    (False, None, True, True),  # ddpjob-trainer is installed here: the run turns it on and says so
    (True, None, True, False),
    (True, False, False, False),  # an explicit argument wins (bench goodput's bare agents)
    (False, True, True, False),
])
def test_a_local_run_uses_fast_restart_by_the_spec_or_where_ddpjob_trainer_is_installed(field, argument, used, noted):
    plan = plan_of(spec_of(elasticPolicy={"fastRestart": field}), fast_restart=argument)
    assert plan.spec.elastic_policy.fast_restart is used
    assert (plan.nodes[0].argv[1:3] == ["-m", "ddpjob_trainer.zygote"]) is used
    assert ("elasticPolicy.fastRestart on: ddpjob-trainer is installed beside ddpjob" in plan.notes) is noted


def test_by_default_a_store_process_hosts_the_c10d_store_and_every_node_joins_it():
    plan = plan_of(spec_of(replicas=3, max_replicas=4))
    confs = [node.env["PET_RDZV_CONF"] for node in plan.nodes]
    assert [conf.rsplit(",", 1)[1] for conf in confs] == ["is_host=false"] * 3
    assert plan.store is not None


def test_the_local_store_runs_the_store_pods_program_with_the_nodes_python_on_loopback():
    spec = spec_of(elasticPolicy={"rdzvPort": 29555})
    pod = render_store_pod(JobRef(name="mlp", namespace="team-a", uid="uid-1"), spec)["spec"]["containers"][0]
    store = plan_of(spec, port=29555).store
    assert store.argv == ["/venv/bin/python", *pod["command"][1:], "--host", "127.0.0.1", "--port", "29555"]
    assert pod["command"][:2] == ["python", "-c"] and pod["args"] == ["--port", "29555"]


def test_with_rdzv_store_node_node_0_hosts_the_c10d_store_as_in_a_cluster():
    plan = plan_of(spec_of(replicas=3, max_replicas=4, elasticPolicy={"rdzvStore": "node"}))
    confs = [node.env["PET_RDZV_CONF"] for node in plan.nodes]
    assert [conf.rsplit(",", 1)[1] for conf in confs] == ["is_host=true", "is_host=false", "is_host=false"]
    assert plan.store is None


def test_the_command_is_the_pods_args_behind_the_local_torchrun_with_mount_paths_rewritten():
    spec = spec_of(args=["--epochs", "2", "--metrics-file", "/snapshots/m.jsonl"])
    node = plan_of(spec, fast_restart=False).nodes[0]
    assert node.argv == ["/venv/bin/torchrun", "-m", "ddpjob_trainer.examples.mlp",
                         "--epochs", "2", "--metrics-file", str(SNAP / "m.jsonl")]


def test_with_the_zygote_each_node_forks_its_workers_from_its_own_server():
    plan = plan_of(spec_of(replicas=2, args=["--epochs", "2"]), fast_restart=True)
    assert [node.argv for node in plan.nodes] == [
        ["/venv/bin/torchrun", "-m", "ddpjob_trainer.zygote", "ddpjob_trainer.examples.mlp", "--epochs", "2"]] * 2
    assert [node.env["DDPJOB_ZYGOTE_SOCKET"] for node in plan.nodes] == [
        "/tmp/ddpjob-zygote-mlp-run-1-0/socket", "/tmp/ddpjob-zygote-mlp-run-1-1/socket"]


def test_the_fork_servers_live_in_the_runtime_directory_it_is_given():
    plan = plan_of(spec_of(replicas=1), fast_restart=True, runtime_dir=Path("/run/user/1000"))
    assert plan.nodes[0].env["DDPJOB_ZYGOTE_SOCKET"] == "/run/user/1000/ddpjob-zygote-mlp-run-1-0/socket"


@pytest.mark.parametrize("environ, expected", [
    ({"XDG_RUNTIME_DIR": "/run/user/1000"}, "/run/user/1000"),  # the user's own, 0700
    ({"XDG_RUNTIME_DIR": "relative"}, tempfile.gettempdir()),
    ({}, tempfile.gettempdir()),
])
def test_a_local_run_puts_them_in_the_users_runtime_directory_else_the_temporary_one(environ, expected):
    assert local_runtime_dir(environ) == Path(expected)


def test_env_values_under_the_mount_path_point_into_the_run_directory():
    spec = spec_of(env=[{"name": "DDPJOB_METRICS_FILE", "value": "/snapshots/m.jsonl"},
                        {"name": "CACHE", "value": "/cache"}])
    plan = plan_of(spec)
    assert plan.nodes[0].env["DDPJOB_METRICS_FILE"] == str(SNAP / "m.jsonl")
    assert plan.nodes[0].env["CACHE"] == "/cache"
    assert plan.metrics_file == SNAP / "m.jsonl"


def test_metrics_default_to_the_trainers_path_in_the_snapshot_dir():
    assert plan_of(spec_of()).metrics_file == SNAP / "metrics.jsonl"


def test_a_job_without_a_snapshot_volume_gets_a_metrics_file_in_the_run_directory():
    plan = plan_of(parse_spec(make_spec()))
    assert plan.snapshot_dir is None and "DDPJOB_SNAPSHOT_DIR" not in plan.nodes[0].env
    assert plan.nodes[0].env["DDPJOB_METRICS_FILE"] == str(RUN / "metrics.jsonl")


def test_an_env_entry_with_value_from_is_refused_with_its_name():
    spec = spec_of(env=[{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}])
    with pytest.raises(UnsupportedLocalEnvError, match=r"spec.env\[0\] \(TOKEN\) uses valueFrom"):
        plan_of(spec)


def test_fast_rendezvous_shortens_the_timeouts_and_says_so():
    spec, notes = local_spec(spec_of(), port=None, fast_rendezvous=True)
    timeouts = spec.elastic_policy.rdzv_timeouts
    assert {k: getattr(timeouts, k) for k in FAST_RDZV_TIMEOUTS} == FAST_RDZV_TIMEOUTS
    assert timeouts.join_seconds == 600  # not a restart cost: kept
    assert any("lastCallSeconds 30 -> 3" in note for note in notes)


def test_fast_rendezvous_never_lengthens_a_shorter_timeout():
    spec = spec_of(elasticPolicy={"rdzvTimeouts": {"lastCallSeconds": 1, "keepAliveIntervalSeconds": 1}})
    local, notes = local_spec(spec, port=None, fast_rendezvous=True)
    assert local.elastic_policy.rdzv_timeouts.last_call_seconds == 1
    assert local.elastic_policy.rdzv_timeouts.keep_alive_interval_seconds == 1
    assert not any("lastCallSeconds" in note for note in notes)


def test_spec_timeouts_are_kept_on_request():
    spec = spec_of()
    local, notes = local_spec(spec, port=None, fast_rendezvous=False)
    assert local.elastic_policy.rdzv_timeouts == spec.elastic_policy.rdzv_timeouts
    assert "last_call_timeout=30" in plan_of(spec, fast_rendezvous=False).nodes[0].env["PET_RDZV_CONF"]


@pytest.mark.parametrize("nproc, resources, expected", [
    ("auto", {"requests": {"cpu": "2"}}, "2"),  # the Pods' rule, not one worker per local node
    ("auto", {"limits": {"nvidia.com/gpu": 2}}, "2"),
    ("auto", {}, "1"),  # a local run has no CPU request unless the spec sets one
    (3, {}, "3"),
    ("gpu", {"limits": {"nvidia.com/gpu": 1}}, "gpu"),
])
def test_nproc_resolves_as_in_the_pods(nproc, resources, expected):
    spec = spec_of(elasticPolicy={"nProcPerNode": nproc}, resources=resources)
    plan = plan_of(spec)
    assert [node.env["PET_NPROC_PER_NODE"] for node in plan.nodes] == [expected] * len(plan.nodes)


def test_a_local_run_the_sandbox_and_the_pod_start_the_same_workers_for_a_cpu_request_of_2(tmp_path):
    spec = spec_of(resources={"requests": {"cpu": "2"}})
    pod = render_pod(JobRef(name="mlp", namespace="team-a", uid="uid-1"), spec, 0)
    pod["metadata"]["uid"] = "pod-uid-0"  # the API server gives each pod its uid when it creates it
    sandbox = container_launch(pod, tmp_path, [], {})
    pod_env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert (plan_of(spec).nodes[0].env["PET_NPROC_PER_NODE"], sandbox.env["PET_NPROC_PER_NODE"],
            pod_env["PET_NPROC_PER_NODE"]) == ("2", "2", "2")
    assert 'nProcPerNode "auto" -> 2 worker(s) per node, as in the Pods' in plan_of(spec).notes


def test_etcd_jobs_keep_the_specs_endpoints_and_say_the_user_runs_etcd():
    spec = spec_of(elasticPolicy={"rdzvBackend": "etcd-v3", "rdzvEndpoints": ["127.0.0.1:2379"]})
    plan = plan_of(spec, port=1234)
    assert plan.nodes[0].env["PET_RDZV_ENDPOINT"] == "127.0.0.1:2379"
    assert "is_host" not in plan.nodes[1].env["PET_RDZV_CONF"]
    assert any("which you run" in note for note in plan.notes)


def test_one_node_per_desired_replica():
    assert [n.index for n in plan_of(spec_of(replicas=3, max_replicas=4)).nodes] == [0, 1, 2]


def test_inherited_env_drops_variables_that_would_fight_the_launch_plan():
    env = inherited_env({"PATH": "/bin", "PET_STANDALONE": "1", "DDPJOB_METRICS_FILE": "/x",
                         "TORCHELASTIC_RUN_ID": "old", "HOME": "/root"})
    assert env == {"PATH": "/bin", "HOME": "/root"}
