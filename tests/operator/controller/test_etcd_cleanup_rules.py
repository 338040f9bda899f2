"""The rendezvous cleanup's executor rules: which jobs hold a finalizer, and the credentials layout it writes."""
from __future__ import annotations

import base64

import pytest

from ddpjob_operator.controller.etcd_cleanup import delete_keys, needs_finalizer, write_credentials
from ddpjob_operator.decide.rendezvous_keys import of_body
from ddpjob_rdzv.settings import settings_from_conf
from ddpjob_sandbox.jobs import make_ddpjob

V3 = {"rdzvBackend": "etcd-v3", "rdzvEndpoints": ["etcd-0:2379", "etcd-1:2379"]}


@pytest.mark.parametrize(("elastic", "uid", "held"), [
    (V3, "u1", True),
    ({"rdzvBackend": "etcd", "rdzvEndpoints": ["e:2379"]}, "u1", False),
    ({}, "u1", False),
    (V3, "", False),
    ({**V3, "minReplicas": 3, "maxReplicas": 2}, "u1", False),
], ids=["etcd-v3", "etcd v2", "c10d", "no uid", "invalid spec"])
def test_only_jobs_with_keys_to_clean_get_the_deletion_finalizer(elastic, uid, held):
    """The filter asks decide/rendezvous_keys.py (tests/operator/decide/test_rendezvous_keys.py)."""
    assert needs_finalizer(body=make_ddpjob(uid=uid, elasticPolicy=elastic)) is held


def test_the_secret_is_written_as_the_pods_see_it_and_the_backend_reads_it(tmp_path):
    secret = {"data": {name: base64.b64encode(value).decode() for name, value in
                       {"username": b"trainer\n", "password": b"s3cret\n", "unrelated": b"x"}.items()}}

    write_credentials(secret, tmp_path)

    assert sorted(p.name for p in tmp_path.iterdir()) == ["password", "username"]
    assert all(p.stat().st_mode & 0o077 == 0 for p in tmp_path.iterdir())
    settings = settings_from_conf("e:1", {"credentials_dir": str(tmp_path), "allow_insecure_credentials": "true"})
    assert (settings.username, settings.password) == ("trainer", "s3cret")


def test_every_generations_keys_are_deleted_under_the_jobs_namespace(monkeypatch):
    """delete_keys dials once per --rdzv_id the job's groups used (the action's run_ids)."""
    from ddpjob_rdzv import cleanup

    calls = []
    monkeypatch.setattr(cleanup, "delete_rendezvous",
                        lambda endpoints, run_id, namespace, **options: calls.append((run_id, namespace, options)) or 2)
    target = of_body(make_ddpjob(uid="abc", namespace="team-a", elasticPolicy=V3, status={"rendezvousGeneration": 1}))

    assert delete_keys(target, None, 3) == 4
    assert calls == [("abc", "team-a", {"read_timeout": 3}), ("abc-1", "team-a", {"read_timeout": 3})]
