"""spec.elasticPolicy.fastRestart in the node pods: the early c10d rendezvous and the worker fork server."""

from __future__ import annotations

import pytest

from ddpjob_operator.api.spec import InvalidSpecError, JobRef, parse_spec
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
    assert env["DDPJOB_ZYGOTE_SOCKET"] == "@ddpjob-zygote-uid-1-1"
    assert env["PET_RDZV_CONF"].endswith(",is_host=false")  # the c10d settings are kept as they are


def test_the_socket_is_per_node_and_per_rendezvous_generation():
    sockets = [container({"fastRestart": True}, index=i, generation=g)[1]["DDPJOB_ZYGOTE_SOCKET"]
               for i, g in ((0, 0), (1, 0), (1, 2))]
    assert sockets == ["@ddpjob-zygote-uid-1-0", "@ddpjob-zygote-uid-1-1", "@ddpjob-zygote-uid-1-2-1"]


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
