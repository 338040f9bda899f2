"""``rdzv_conf credentials_dir``: a mounted Secret's files stand for the connection keys they name.

The operator mounts ``spec.elasticPolicy.rdzvSecretName`` and passes only the
directory, so these tests write Secret-shaped directories (optionally through
``..data`` symlinks, as the kubelet does) and check the settings and a real
etcd connection.
"""
from __future__ import annotations

import os
import shutil
import threading
import time
from datetime import timedelta

import pytest

from ddpjob_rdzv import delete_rendezvous
from ddpjob_rdzv.client import EtcdConnection
from ddpjob_rdzv.settings import CREDENTIAL_FILES, settings_from_conf, with_credentials_dir
from ddpjob_trainer.rendezvous import store as store_module
from ddpjob_trainer.rendezvous.backend import EtcdV3RendezvousBackend
from ddpjob_trainer.rendezvous.store import EtcdV3Store
from tests.rendezvous.test_backend import PLAINTEXT_OK, etcd_with_auth, make_backend  # noqa: F401  (fixture)
from tests.rendezvous.test_tls import backend_for, tls_etcd  # noqa: F401  (fixture)


def secret_dir(root, files: dict[str, str], kubelet_layout: bool = True):
    """A directory like a mounted Secret: with the kubelet's layout each key is a symlink into ``..data``."""
    root.mkdir(parents=True, exist_ok=True)
    data = root / "..data" if kubelet_layout else root
    data.mkdir(exist_ok=True)
    for name, content in files.items():
        (data / name).write_text(content)
        if kubelet_layout:
            os.symlink(f"..data/{name}", root / name)
    return root


def test_every_documented_key_maps_to_the_conf_key_it_stands_for(tmp_path):
    files = {name: f"content of {name}\n" for name in CREDENTIAL_FILES}
    directory = secret_dir(tmp_path / "secret", files)

    conf = with_credentials_dir({"credentials_dir": str(directory)})

    assert conf == {
        "credentials_dir": str(directory),
        "ca_cert": str(directory / "ca.crt"),
        "ssl_cert": str(directory / "tls.crt"),
        "ssl_cert_key": str(directory / "tls.key"),
        "username": "content of username",  # the name itself, not a path
        "password_file": str(directory / "password"),
    }


def test_only_the_files_present_are_used(tmp_path):
    directory = secret_dir(tmp_path / "secret", {"username": "trainer", "password": "pw\n"})

    settings = settings_from_conf("h:1", {"credentials_dir": str(directory), **PLAINTEXT_OK})

    assert (settings.username, settings.password, settings.ca_cert, settings.ssl_cert) == ("trainer", "pw", None, None)


def test_explicit_keys_win_over_the_directory(tmp_path):
    directory = secret_dir(tmp_path / "secret", {"username": "from-secret", "password": "secret-pw"})

    settings = settings_from_conf("h:1", {"credentials_dir": str(directory), "username": "explicit",
                                          "password": "explicit-pw", **PLAINTEXT_OK})

    assert (settings.username, settings.password) == ("explicit", "explicit-pw")


def test_a_missing_directory_is_an_error_naming_it(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(ValueError, match=f"rdzv_conf credentials_dir \\('{missing}'\\) must name a directory"):
        settings_from_conf("h:1", {"credentials_dir": str(missing)})


def test_an_incomplete_secret_is_reported_with_the_conf_keys_it_implies(tmp_path):
    directory = secret_dir(tmp_path / "secret", {"tls.crt": "cert"})
    with pytest.raises(ValueError, match="ssl_cert .* and ssl_cert_key \\(None\\) must be given together"):
        settings_from_conf("h:1", {"credentials_dir": str(directory)})


def test_mutual_tls_from_a_secret_directory(tls_etcd, tmp_path):  # noqa: F811
    endpoint, certs = tls_etcd
    directory = tmp_path / "secret"
    directory.mkdir()
    for source, name in (("ca.crt", "ca.crt"), ("client.crt", "tls.crt"), ("client.key", "tls.key")):
        shutil.copy(certs / source, directory / name)
    backend = backend_for(f"https://{endpoint}", {"credentials_dir": str(directory)})

    _, token, written = backend.set_state(b"v1")

    assert written
    assert delete_rendezvous(endpoint, backend.run_id, credentials_dir=str(directory)) == 1
    assert backend.get_state() is None


def test_username_and_password_from_a_secret_directory(etcd_with_auth, tmp_path):  # noqa: F811
    directory = secret_dir(tmp_path / "secret", {"username": "trainer\n", "password": "s3cret\n"})
    backend = make_backend(etcd_with_auth, credentials_dir=str(directory), **PLAINTEXT_OK)

    backend.set_state(b"v1")

    assert delete_rendezvous(etcd_with_auth.endpoint, backend.run_id, credentials_dir=str(directory),
                             **PLAINTEXT_OK) == 1



def test_store_watches_work_over_mutual_tls(tls_etcd, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setattr(store_module, "_WATCHED_POLL_INTERVAL_S", 30.0)  # only the watch can wake it in time
    monkeypatch.setattr(store_module, "_MIN_POLL_INTERVAL_S", 30.0)
    endpoint, certs = tls_etcd
    directory = tmp_path / "secret"
    directory.mkdir()
    for source, name in (("ca.crt", "ca.crt"), ("client.crt", "tls.crt"), ("client.key", "tls.key")):
        shutil.copy(certs / source, directory / name)
    conf = {"credentials_dir": str(directory)}
    reader = backend_for(f"https://{endpoint}", conf)
    reader.set_state(b"v1")
    writer = EtcdV3RendezvousBackend(EtcdConnection(settings_from_conf(f"https://{endpoint}", conf)), reader.run_id)
    writer.get_state()
    done = threading.Event()

    def wait():
        EtcdV3Store(reader._connection, reader).wait(["MASTER_PORT"], timedelta(seconds=20))
        done.set()

    threading.Thread(target=wait, daemon=True).start()
    time.sleep(1.0)  # the reader is asleep on its watch
    EtcdV3Store(writer._connection, writer).set("MASTER_PORT", "29500")

    assert done.wait(3), "the write over TLS did not wake the reader"
