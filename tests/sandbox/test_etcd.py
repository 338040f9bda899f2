"""Which etcd a rendezvous backend gets: the pinned 3.6 for ddpjob's etcd-v3 (no v2 API), Debian's
3.4 with the v2 API only for torch's own etcd backend; a missing pinned etcd fails, naming the
command that builds it. tests/cluster/sandbox/test_etcd.py trains through each."""
from __future__ import annotations

import pytest

from ddpjob_sandbox.binaries import MissingBinaryError
from ddpjob_sandbox.etcd import V2, api_for_backend, running_etcd


@pytest.mark.parametrize(("backend", "release", "v2_api"), [("etcd-v3", "3.6.", False), ("etcd", "3.4.", True),
                                                         ("etcd-v2", "3.4.", True)])
def test_each_backend_gets_the_etcd_release_it_is_meant_for(backend, release, v2_api):
    with running_etcd(api=api_for_backend(backend)) as server:
        assert server.get("/version")["etcdserver"].startswith(release)
        try:
            server.get("/v2/keys/")
            served = True
        except OSError:  # urllib's HTTPError (404 on 3.6, where the v2 API is gone) is an OSError
            served = False
        assert served is v2_api


def test_a_missing_pinned_etcd_fails_naming_the_command_that_builds_it(tmp_path):
    with pytest.raises(MissingBinaryError, match=r"etcd not found in .*: build it with make cluster-binaries"):
        with running_etcd(bin_dir=tmp_path):
            pass


def test_a_missing_debian_etcd_for_torchs_v2_backend_names_its_install_script(monkeypatch, tmp_path):
    monkeypatch.setattr("ddpjob_sandbox.binaries.DEBIAN_BIN_DIR", tmp_path)
    with pytest.raises(MissingBinaryError, match=r"install it with scripts/install-system-deps.sh"):
        with running_etcd(api=V2):
            pass
