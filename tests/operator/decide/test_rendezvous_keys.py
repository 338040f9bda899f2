"""Which jobs have etcd rendezvous keys to delete, where, and when a pass returns the action
(decide/rendezvous_keys.py, decide/reconcile.py): plain data and a fixed clock."""
from __future__ import annotations

import pytest

from ddpjob_operator.api import constants as C
from ddpjob_operator.decide.actions import DeleteRendezvousKeys
from ddpjob_operator.decide.observed import view_pods
from ddpjob_operator.decide.reconcile import reconcile
from ddpjob_operator.decide.rendezvous_keys import due_on_finish, of_body
from ddpjob_sandbox.jobs import make_ddpjob
from tests.operator.builders import at, make_pod, observe

V3 = {"rdzvBackend": "etcd-v3", "rdzvEndpoints": ["etcd-0:2379", "etcd-1:2379"]}
ENDPOINTS = ("etcd-0:2379", "etcd-1:2379")


def keys(uid: str = "u1", secret: str | None = None, insecure: bool = False) -> DeleteRendezvousKeys:
    return DeleteRendezvousKeys(ENDPOINTS, uid, (uid,), f"/ddpjob/rdzv/default/{uid}/", secret, "default", insecure)


@pytest.mark.parametrize(("elastic", "uid", "expected"), [
    (V3, "u1", keys()),
    ({**V3, "rdzvSecretName": "creds"}, "u1", keys(secret="creds")),
    ({**V3, "rdzvSecretName": "creds", "rdzvAllowInsecureCredentials": True}, "u1", keys(secret="creds", insecure=True)),
    ({"rdzvBackend": "etcd", "rdzvEndpoints": ["e:2379"]}, "u1", None),  # v2 store: the v3 client cannot reach it
    ({}, "u1", None),  # c10d keeps nothing outside the pods
    (V3, "", None),  # no uid, no run id
    ({**V3, "minReplicas": 3, "maxReplicas": 2}, "u1", None),  # invalid spec: nothing is assumed
    ({"rdzvBackend": "etcd-v3", "managedEtcd": {"enabled": True}}, "u1", None),  # goes with the job, keys and all
], ids=["etcd-v3", "etcd-v3 with secret", "etcd-v3 with plaintext allowed", "etcd v2", "c10d", "no uid",
        "invalid spec", "managed etcd"])
def test_only_valid_etcd_v3_jobs_have_keys_to_clean(elastic, uid, expected):
    assert of_body(make_ddpjob(uid=uid, elasticPolicy=elastic)) == expected


def test_the_prefix_is_the_backends_key_layout_under_the_jobs_namespace():
    assert of_body(make_ddpjob(uid="abc", namespace="team-a", elasticPolicy=V3)).prefix == "/ddpjob/rdzv/team-a/abc/"


def test_every_rendezvous_generation_of_the_job_is_cleaned():
    target = of_body(make_ddpjob(uid="abc", elasticPolicy=V3, status={"rendezvousGeneration": 2}))

    assert target.run_ids == ("abc", "abc-1", "abc-2")  # the ids launch.rdzv_id gave each group
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


def deletions(result) -> list[DeleteRendezvousKeys]:
    return [a for a in result.actions if isinstance(a, DeleteRendezvousKeys)]


def test_a_pass_that_leaves_an_etcd_v3_job_finished_returns_the_deletion_of_its_keys():
    job = make_ddpjob(uid="abc", replicas=2, elasticPolicy=V3, status={"phase": C.PHASE_RUNNING})
    pods = [make_pod(job, i, phase="Succeeded", finished_at=at(10)) for i in range(2)]

    result = reconcile(job, observe(pods), at(20))

    assert result.status["phase"] == C.PHASE_SUCCEEDED
    assert deletions(result) == [DeleteRendezvousKeys(ENDPOINTS, "abc", ("abc",), "/ddpjob/rdzv/default/abc/",
                                                      None, "default", False)]


def test_a_running_or_a_c10d_job_returns_no_key_deletion():
    running = make_ddpjob(replicas=2, elasticPolicy=V3, status={"phase": C.PHASE_RUNNING})
    c10d = make_ddpjob(replicas=2, status={"phase": C.PHASE_RUNNING})
    done = [make_pod(c10d, i, phase="Succeeded", finished_at=at(10)) for i in range(2)]

    assert deletions(reconcile(running, observe([make_pod(running, i) for i in range(2)]), at(20))) == []
    assert deletions(reconcile(c10d, observe(done), at(20))) == []
