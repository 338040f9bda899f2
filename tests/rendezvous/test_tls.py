"""The etcd v3 backend over mutual TLS: a throwaway CA, an etcd (the pinned 3.6) that requires client certificates."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError

from ddpjob_rdzv.client import EtcdConnection
from ddpjob_rdzv.settings import settings_from_conf
from ddpjob_trainer.rendezvous.backend import EtcdV3RendezvousBackend
from ddpjob_sandbox.etcd import EtcdTls, running_etcd
from ddpjob_sandbox.torchrun import unique_run_id

pytestmark = pytest.mark.skipif(not shutil.which("openssl"), reason="needs openssl")


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def issue(cwd: Path, name: str, extensions: str) -> None:
    """A key and a certificate for ``name`` signed by the CA in ``cwd``."""
    (cwd / f"{name}.ext").write_text(extensions)
    openssl("req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
            "-subj", f"/CN={name}", cwd=cwd)
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{name}.crt", "-days", "1", "-extfile", f"{name}.ext", cwd=cwd)


@pytest.fixture(scope="module")
def tls_etcd(tmp_path_factory):
    """(endpoint, certificate directory) of an etcd that accepts only clients with a certificate of our CA."""
    certs = tmp_path_factory.mktemp("certs")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "1",
            "-subj", "/CN=ddpjob-test-ca", cwd=certs)
    issue(certs, "server", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    issue(certs, "client", "extendedKeyUsage=clientAuth\n")
    tls = EtcdTls(ca=certs / "ca.crt", cert=certs / "server.crt", key=certs / "server.key",
                  client_cert=certs / "client.crt", client_key=certs / "client.key")
    with running_etcd(certs, tls=tls) as server:
        yield server.endpoint, certs


def client_conf(certs: Path) -> dict:
    return {"ca_cert": str(certs / "ca.crt"), "ssl_cert": str(certs / "client.crt"),
            "ssl_cert_key": str(certs / "client.key")}


def backend_for(endpoint: str, conf: dict) -> EtcdV3RendezvousBackend:
    return EtcdV3RendezvousBackend(EtcdConnection(settings_from_conf(endpoint, conf)), unique_run_id())


def test_a_client_certificate_signed_by_the_ca_gets_the_cas_semantics(tls_etcd):
    endpoint, certs = tls_etcd
    backend = backend_for(f"https://{endpoint}", client_conf(certs))

    _, token, written = backend.set_state(b"v1")

    assert written
    assert backend.set_state(b"v2", token)[::2] == (b"v2", True)


def test_without_a_client_certificate_the_endpoint_is_reported_unreachable(tls_etcd):
    endpoint, certs = tls_etcd
    backend = backend_for(endpoint, {"ca_cert": str(certs / "ca.crt"), "read_timeout": "2"})

    with pytest.raises(RendezvousConnectionError, match=f"--rdzv_endpoint={endpoint} answered within"):
        backend.get_state()
