"""An etcd password never leaves the agent in plaintext unless the job allows it explicitly.

Whoever reads the password may write the rendezvous state, a pickle every agent
loads. ``settings_from_conf`` refuses a username and password without
``ca_cert`` (a rdzvSecretName Secret without ``ca.crt``) unless
``allow_insecure_credentials=true`` (spec.elasticPolicy.rdzvAllowInsecureCredentials).
The refusal comes before any connection: a listening socket standing in for
etcd sees none, in the handler torchrun builds and in a real torchrun agent.
"""
from __future__ import annotations

import contextlib
import socket
from pathlib import Path

import pytest

from ddpjob_rdzv.settings import settings_from_conf
from ddpjob_sandbox.torchrun import AgentGroup, Rendezvous, unique_run_id

REFUSED = (
    "rdzv_conf username ('trainer') and password would travel to etcd in plaintext: no ca_cert is set "
    "(a rdzvSecretName Secret without ca.crt). Add the CA of etcd's server certificate as ca_cert (the "
    "Secret's ca.crt) to use TLS, or accept plaintext on a network you trust with rdzv_conf "
    "allow_insecure_credentials=true (spec.elasticPolicy.rdzvAllowInsecureCredentials: true)")


def basic_auth_secret(directory: Path, **extra: str) -> Path:
    """A mounted kubernetes.io/basic-auth Secret (plus ``extra`` files), as the kubelet writes it."""
    directory.mkdir()
    for name, content in {"username": "trainer\n", "password": "s3cret\n", **extra}.items():
        (directory / name).write_text(content)
    return directory


@pytest.mark.parametrize("conf", [
    {"username": "trainer", "password": "s3cret"},
    {"username": "trainer", "password": "s3cret", "allow_insecure_credentials": "false"},
], ids=["explicit keys", "explicitly not allowed"])
def test_a_password_without_a_ca_is_refused(conf):
    with pytest.raises(ValueError) as refused:
        settings_from_conf("etcd:2379", conf)
    assert str(refused.value) == REFUSED


def test_a_secret_without_ca_crt_is_refused(tmp_path):
    directory = basic_auth_secret(tmp_path / "secret")
    with pytest.raises(ValueError) as refused:
        settings_from_conf("etcd:2379", {"credentials_dir": str(directory)})
    assert str(refused.value) == REFUSED


@pytest.mark.parametrize("allow", ["true", "1", "TRUE"])
def test_plaintext_is_allowed_when_asked_for(tmp_path, allow):
    directory = basic_auth_secret(tmp_path / "secret")
    settings = settings_from_conf("etcd:2379", {"credentials_dir": str(directory),
                                                "allow_insecure_credentials": allow})
    assert (settings.username, settings.password, settings.ca_cert) == ("trainer", "s3cret", None)


def test_a_secret_with_ca_crt_sends_the_password_over_tls_without_asking(tmp_path):
    directory = basic_auth_secret(tmp_path / "secret", **{"ca.crt": "-----BEGIN CERTIFICATE-----\n"})
    settings = settings_from_conf("etcd:2379", {"credentials_dir": str(directory)})
    assert (settings.username, settings.ca_cert) == ("trainer", str(directory / "ca.crt"))


def test_no_password_needs_no_permission():
    assert settings_from_conf("etcd:2379", {}).username is None


def test_a_permission_that_is_not_a_boolean_is_an_error():
    with pytest.raises(ValueError) as refused:
        settings_from_conf("etcd:2379", {"username": "trainer", "password": "s3cret",
                                         "allow_insecure_credentials": "yes please"})
    assert str(refused.value) == "rdzv_conf allow_insecure_credentials ('yes please') must be true or false"


@contextlib.contextmanager
def fake_etcd():
    """A listening socket where etcd would be; yields (endpoint, connections_seen)."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        server.setblocking(False)

        def connections() -> int:
            count = 0
            with contextlib.suppress(BlockingIOError):
                while True:
                    server.accept()[0].close()
                    count += 1
            return count

        yield f"127.0.0.1:{server.getsockname()[1]}", connections


def test_torchruns_handler_refuses_before_connecting(tmp_path):
    from torch.distributed.elastic.rendezvous import RendezvousParameters, rendezvous_handler_registry

    directory = basic_auth_secret(tmp_path / "secret")
    with fake_etcd() as (endpoint, connections):
        params = RendezvousParameters("etcd-v3", endpoint, unique_run_id(), 1, 1, credentials_dir=str(directory))
        with pytest.raises(ValueError) as refused:
            rendezvous_handler_registry.create_handler(params)
        assert connections() == 0
    assert str(refused.value) == REFUSED


def test_a_torchrun_agent_with_such_a_secret_exits_at_start_saying_why(tmp_path):
    directory = basic_auth_secret(tmp_path / "secret")
    script = tmp_path / "never_started.py"
    script.write_text("raise SystemExit('a worker started although the rendezvous was refused')\n")
    with fake_etcd() as (endpoint, connections):
        rdzv = Rendezvous("etcd-v3", endpoint, unique_run_id(), "1", {"credentials_dir": str(directory)})
        with AgentGroup(tmp_path, rdzv, [str(script)]) as group:
            agent = group.start()
            code = agent.wait(120)
        assert connections() == 0
    assert code != 0
    assert REFUSED in " ".join(agent.log_tail(20000).split()), agent.log_tail()
