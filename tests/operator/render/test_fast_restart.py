"""spec.elasticPolicy.fastRestart in the node pods: the early c10d rendezvous and the worker fork server."""

from __future__ import annotations

import pytest

from ddpjob_operator.api.job_ref import JobRef
from ddpjob_operator.api.validation import InvalidSpecError, parse_spec
from ddpjob_operator.render.node_pod import render_pod
from ddpjob_sandbox.jobs import make_spec

REF = JobRef(name="mlp", namespace="team-a", uid="uid-1", generation=1)
ETCD_V3 = {"rdzvBackend": "etcd-v3", "rdzvEndpoints": ["e1:2379"]}


def container(elastic=None, index=1, generation=0, **fields):
    fields.setdefault("args", ["--epochs", "2"])
    spec = parse_spec(make_spec(replicas=2, elasticPolicy=elastic or {}, **fields))
    pod = render_pod(REF, spec, index, generation)
    (c,) = pod["spec"]["containers"]
    return c, {e["name"]: e.get("value") for e in c["env"]}


def test_off_by_default_pods_run_torchs_c10d_and_fresh_workers():
    c, env = container()
    assert c["command"] == ["torchrun"] and c["args"] == ["-m", "ddpjob_trainer.examples.mlp", "--epochs", "2"]
    assert env["PET_RDZV_BACKEND"] == "c10d" and "DDPJOB_ZYGOTE_SOCKET" not in env


def test_a_module_job_forks_its_workers_from_the_nodes_server_and_rendezvouses_early():
    c, env = container({"fastRestart": True})
    assert c["command"] == ["torchrun"]
    assert c["args"] == ["-m", "ddpjob_trainer.zygote", "ddpjob_trainer.examples.mlp", "--epochs", "2"]
    assert env["PET_RDZV_BACKEND"] == "ddpjob-c10d"
    assert env["DDPJOB_ZYGOTE_SOCKET"] == "/run/ddpjob-zygote/ddpjob-zygote-uid-1-1/socket"
    assert env["PET_RDZV_CONF"].endswith(",is_host=false")  # the c10d settings are kept as they are


def test_the_socket_is_per_node_and_per_rendezvous_generation():
    sockets = [container({"fastRestart": True}, index=i, generation=g)[1]["DDPJOB_ZYGOTE_SOCKET"]
               for i, g in ((0, 0), (1, 0), (1, 2))]
    assert sockets == ["/run/ddpjob-zygote/ddpjob-zygote-uid-1-0/socket",
                       "/run/ddpjob-zygote/ddpjob-zygote-uid-1-1/socket",
                       "/run/ddpjob-zygote/ddpjob-zygote-uid-1-2-1/socket"]


@pytest.mark.parametrize("elastic, backend", [
    (ETCD_V3, "etcd-v3"),  # completes a re-rendezvous early by itself
    ({"rdzvBackend": "etcd", "rdzvEndpoints": ["e1:2379"]}, "etcd"),  # torch's: no hook for it
])
def test_etcd_backends_keep_their_backend_and_get_the_fork_server(elastic, backend):
    c, env = container({**elastic, "fastRestart": True})
    assert env["PET_RDZV_BACKEND"] == backend
    assert c["args"][:3] == ["-m", "ddpjob_trainer.zygote", "ddpjob_trainer.examples.mlp"]


def test_a_script_job_rendezvouses_early_but_keeps_fresh_workers():
    c, env = container({"fastRestart": True}, module=None, script="/app/train.py")
    assert c["args"] == ["/app/train.py", "--epochs", "2"]
    assert env["PET_RDZV_BACKEND"] == "ddpjob-c10d" and "DDPJOB_ZYGOTE_SOCKET" not in env


def test_a_users_zygote_socket_is_refused_with_the_field_to_use():
    with pytest.raises(InvalidSpecError) as raised:
        parse_spec(make_spec(env=[{"name": "DDPJOB_ZYGOTE_SOCKET", "value": "@mine"}]))
    assert str(raised.value) == ("invalid DDPJob: spec.env[0].name (\"DDPJOB_ZYGOTE_SOCKET\") is set by the operator; "
                                 "use spec.elasticPolicy.fastRestart instead")


def test_a_pod_spec_cannot_carry_the_agents_token():
    # A pod's spec is readable by whoever may get pods; each agent makes its own.
    with pytest.raises(InvalidSpecError) as raised:
        parse_spec(make_spec(env=[{"name": "DDPJOB_ZYGOTE_TOKEN", "value": "0" * 64}]))
    assert str(raised.value) == ("invalid DDPJob: spec.env[0].name (\"DDPJOB_ZYGOTE_TOKEN\") is set by the operator; "
                                 "use spec.elasticPolicy.fastRestart (each node's agent makes its own token) instead")


def volumes_and_mounts(elastic, **fields):
    fields.setdefault("args", ["--epochs", "2"])
    spec = parse_spec(make_spec(replicas=2, elasticPolicy=elastic, preflight={"enabled": True}, **fields))
    pod = render_pod(REF, spec, 1)["spec"]
    (c,), (init,) = pod["containers"], pod["initContainers"]
    return {v["name"]: v for v in pod["volumes"]}, {m["name"]: m for m in c["volumeMounts"]}, init["volumeMounts"]


def test_the_fork_servers_socket_lies_in_an_empty_dir_only_the_trainer_container_mounts():
    volumes, mounts, init_mounts = volumes_and_mounts({"fastRestart": True})
    assert volumes["zygote"] == {"name": "zygote", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}
    assert mounts["zygote"] == {"name": "zygote", "mountPath": "/run/ddpjob-zygote"}
    assert "zygote" not in {m["name"] for m in init_mounts}
    _, env = container({"fastRestart": True})
    assert env["DDPJOB_ZYGOTE_SOCKET"].startswith("/run/ddpjob-zygote/")


@pytest.mark.parametrize("elastic, fields", [
    ({}, {}),
    ({"fastRestart": True}, {"module": None, "script": "/app/t.py"}),  # the server runs modules only
])
def test_pods_without_a_fork_server_get_no_such_volume(elastic, fields):
    volumes, mounts, _ = volumes_and_mounts(elastic, **fields)
    assert "zygote" not in volumes and "zygote" not in mounts

