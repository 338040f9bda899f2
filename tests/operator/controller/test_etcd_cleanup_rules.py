"""Pure rules of the rendezvous cleanup: which jobs, when, and the credentials layout it writes."""
from __future__ import annotations

import base64

import pytest

from ddpjob_operator.decide.observed import view_pods
from ddpjob_operator.controller.etcd_cleanup import (
    CleanupTarget, cleanup_target, due_on_finish, needs_finalizer, write_credentials
)
from ddpjob_rdzv.settings import settings_from_conf
from ddpjob_sandbox.jobs import make_ddpjob
from tests.operator.builders import make_pod

V3 = {"rdzvBackend": "etcd-v3", "rdzvEndpoints": ["etcd-0:2379", "etcd-1:2379"]}


@pytest.mark.parametrize(("elastic", "uid", "expected"), [
    (V3, "u1", CleanupTarget(("etcd-0:2379", "etcd-1:2379"), "u1", None, namespace="default")),
    ({**V3, "rdzvSecretName": "creds"}, "u1",
     CleanupTarget(("etcd-0:2379", "etcd-1:2379"), "u1", "creds", namespace="default")),
    ({**V3, "rdzvSecretName": "creds", "rdzvAllowInsecureCredentials": True}, "u1",
     CleanupTarget(("etcd-0:2379", "etcd-1:2379"), "u1", "creds", namespace="default",
                   allow_insecure_credentials=True)),
    ({"rdzvBackend": "etcd", "rdzvEndpoints": ["e:2379"]}, "u1", None),  # v2 store: the v3 client cannot reach it
    ({}, "u1", None),  # c10d keeps nothing outside the pods
    (V3, "", None),  # no uid, no run id
    ({**V3, "minReplicas": 3, "maxReplicas": 2}, "u1", None),  # invalid spec: nothing is assumed
], ids=["etcd-v3", "etcd-v3 with secret", "etcd-v3 with plaintext allowed", "etcd v2", "c10d", "no uid", "invalid spec"])
def test_only_valid_etcd_v3_jobs_have_keys_to_clean(elastic, uid, expected):
    body = make_ddpjob(uid=uid, elasticPolicy=elastic)

    assert cleanup_target(body) == expected
    assert needs_finalizer(body=body) is (expected is not None)


def test_the_target_prefix_is_the_backends_key_layout_under_the_jobs_namespace():
    body = make_ddpjob(uid="abc", namespace="team-a", elasticPolicy=V3)

    assert cleanup_target(body).prefix == "/ddpjob/rdzv/team-a/abc/"


def test_every_rendezvous_generation_of_the_job_is_cleaned():
    target = cleanup_target(make_ddpjob(uid="abc", elasticPolicy=V3, status={"rendezvousGeneration": 2}))

    assert target.run_ids == ["abc", "abc-1", "abc-2"]  # the ids launch.rdzv_id gave each group
    assert target.prefix == "/ddpjob/rdzv/default/abc/ (and 2 later generation(s))"


@pytest.mark.parametrize(("phase", "pod_phases", "due"), [
    ("Succeeded", ["Succeeded", "Succeeded"], True),
    ("Failed", ["Failed", "Succeeded"], True),
    ("Failed", ["Failed", "Running"], False),  # cleanPodPolicy None leaves an agent running
    ("Succeeded", ["Succeeded", "Pending"], False),
    ("Running", ["Running", "Running"], False),
    ("Succeeded", [], True),
])
def test_keys_go_on_finish_only_once_no_agent_is_left(phase, pod_phases, due):
    body = make_ddpjob(elasticPolicy=V3)
    pods = view_pods(make_pod(body, i, phase=p) for i, p in enumerate(pod_phases))

    assert due_on_finish({"phase": phase}, pods) is due


def test_the_secret_is_written_as_the_pods_see_it_and_the_backend_reads_it(tmp_path):
    secret = {"data": {name: base64.b64encode(value).decode() for name, value in
                       {"username": b"trainer\n", "password": b"s3cret\n", "unrelated": b"x"}.items()}}

    write_credentials(secret, tmp_path)

    assert sorted(p.name for p in tmp_path.iterdir()) == ["password", "username"]
    assert all(p.stat().st_mode & 0o077 == 0 for p in tmp_path.iterdir())
    settings = settings_from_conf("e:1", {"credentials_dir": str(tmp_path), "allow_insecure_credentials": "true"})
    assert (settings.username, settings.password) == ("trainer", "s3cret")
