"""Pods of etcd-backed jobs: the rdzvSecretName Secret is mounted read-only and PET_RDZV_CONF points at it.

Pure: render_pod on builders' jobs. The last test closes the loop with the
backend's own settings parser, so the rendered conf and ddpjob_rdzv agree on
what the mounted files mean.
"""
from __future__ import annotations

import pytest

from ddpjob_operator.api import constants as C
from ddpjob_operator.render.node_pod import render_pod
from ddpjob_operator.api.validation import parse_spec
from ddpjob_rdzv.settings import settings_from_conf
from tests.operator.builders import job_ref
from ddpjob_sandbox.jobs import make_ddpjob

V3 = {"rdzvBackend": "etcd-v3", "rdzvEndpoints": ["etcd-0:2379", "etcd-1:2379"]}
V2 = {"rdzvBackend": "etcd", "rdzvEndpoints": ["etcd:2379"]}


def pod_of(**elastic) -> dict:
    body = make_ddpjob(elasticPolicy=elastic)
    return render_pod(job_ref(body), parse_spec(body["spec"]), 0)


def env_of(pod: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}


def conf_of(pod: dict) -> dict[str, str]:
    return dict(item.split("=", 1) for item in env_of(pod)["PET_RDZV_CONF"].split(","))


@pytest.mark.parametrize("elastic", [V3, V2], ids=["etcd-v3", "etcd"])
def test_the_secret_is_mounted_read_only_at_the_documented_path(elastic):
    pod = pod_of(**elastic, rdzvSecretName="etcd-client")

    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    mounts = {m["name"]: m for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert volumes[C.RDZV_SECRET_VOLUME] == {"name": "rdzv-credentials", "secret": {"secretName": "etcd-client"}}
    assert mounts[C.RDZV_SECRET_VOLUME] == {"name": "rdzv-credentials", "mountPath": "/etc/ddpjob/rdzv",
                                            "readOnly": True}


def test_etcd_v3_conf_names_the_mounted_directory_only():
    conf = conf_of(pod_of(**V3, rdzvSecretName="etcd-client"))

    assert conf["credentials_dir"] == "/etc/ddpjob/rdzv"
    assert not {"password", "username", "ca_cert", "protocol"} & conf.keys()


def test_torchs_etcd_v2_conf_names_each_tls_file_with_torchs_keys():
    conf = conf_of(pod_of(**V2, rdzvSecretName="etcd-client"))

    assert {k: conf[k] for k in ("protocol", "cacert", "cert", "key")} == {
        "protocol": "https", "cacert": "/etc/ddpjob/rdzv/ca.crt",
        "cert": "/etc/ddpjob/rdzv/tls.crt", "key": "/etc/ddpjob/rdzv/tls.key"}


@pytest.mark.parametrize("elastic", [V3, V2, {}], ids=["etcd-v3", "etcd", "c10d"])
def test_without_a_secret_nothing_is_mounted_and_the_conf_has_no_credentials(elastic):
    pod = pod_of(**elastic)

    assert C.RDZV_SECRET_VOLUME not in [v["name"] for v in pod["spec"]["volumes"]]
    assert not {"credentials_dir", "protocol", "cacert"} & conf_of(pod).keys()


def test_the_secret_name_appears_only_in_the_volume_never_in_env_or_args():
    pod = pod_of(**V3, rdzvSecretName="etcd-client")
    container = pod["spec"]["containers"][0]

    assert "etcd-client" not in repr([container["env"], container["args"], container["command"]])
    assert all("valueFrom" not in e for e in container["env"])


def mounted(pod: dict, directory) -> dict[str, str]:
    """The pod's rdzv_conf as the agent reads it, with the Secret's mount at ``directory``."""
    return {k: v.replace(C.RDZV_SECRET_MOUNT_PATH, str(directory)) for k, v in conf_of(pod).items()}


def basic_auth_secret(directory) -> None:
    (directory / "username").write_text("trainer\n")
    (directory / "password").write_text("s3cret\n")


def test_the_rendered_conf_is_what_the_backend_reads_from_a_mounted_secret(tmp_path):
    pod = pod_of(**V3, rdzvSecretName="etcd-client", rdzvAllowInsecureCredentials=True)
    basic_auth_secret(tmp_path)

    settings = settings_from_conf(env_of(pod)["PET_RDZV_ENDPOINT"], mounted(pod, tmp_path))

    assert conf_of(pod)["allow_insecure_credentials"] == "true"
    assert (settings.username, settings.password) == ("trainer", "s3cret")
    assert settings.endpoints == (("etcd-0", 2379), ("etcd-1", 2379))


def test_a_password_without_ca_crt_is_refused_by_the_agent_unless_the_spec_allows_plaintext(tmp_path):
    pod = pod_of(**V3, rdzvSecretName="etcd-client")
    basic_auth_secret(tmp_path)

    with pytest.raises(ValueError) as refused:
        settings_from_conf(env_of(pod)["PET_RDZV_ENDPOINT"], mounted(pod, tmp_path))

    assert "allow_insecure_credentials" not in conf_of(pod)
    assert str(refused.value) == (
        "rdzv_conf username ('trainer') and password would travel to etcd in plaintext: no ca_cert is set "
        "(a rdzvSecretName Secret without ca.crt). Add the CA of etcd's server certificate as ca_cert (the "
        "Secret's ca.crt) to use TLS, or accept plaintext on a network you trust with rdzv_conf "
        "allow_insecure_credentials=true (spec.elasticPolicy.rdzvAllowInsecureCredentials: true)")


def test_a_password_with_ca_crt_needs_no_permission(tmp_path):
    pod = pod_of(**V3, rdzvSecretName="etcd-client")
    basic_auth_secret(tmp_path)
    (tmp_path / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")

    settings = settings_from_conf(env_of(pod)["PET_RDZV_ENDPOINT"], mounted(pod, tmp_path))

    assert (settings.username, settings.ca_cert) == ("trainer", str(tmp_path / "ca.crt"))


@pytest.mark.parametrize("elastic", [{**V3}, {**V2, "rdzvSecretName": "etcd-client"}], ids=["no secret", "etcd v2"])
def test_allowing_plaintext_renders_nothing_where_no_password_can_be_sent(elastic):
    conf = conf_of(pod_of(**elastic, rdzvAllowInsecureCredentials=True))

    assert "allow_insecure_credentials" not in conf
