"""The helm-installed operator on the real control plane deletes an etcd-v3 job's rendezvous keys
from a REAL etcd, on finish and on delete.

Keys are written with the real layout (``ddpjob_rdzv.keys``) under the job's uid, plus a key of
another run that must survive. The etcd is the pinned etcd 3.6 (ddpjob_sandbox/etcd.py), once with
user/password auth read from the job's ``rdzvSecretName`` Secret (a release with the chart value
rbac.readSecrets=true). A dead endpoint proves a failed cleanup is reported as a Warning Event and
never holds up a deletion beyond its bound (the tier's releases try 1 s per attempt,
operators.RELEASE_ENV); the chart's default RBAC (no Secret reads), enforced by the real API
server and counted in its audit log, proves the cleanup is skipped at once, saying which chart
value to set.
"""
from __future__ import annotations

import base64
import sys
import time

import pytest

from ddpjob_operator.controller import etcd_cleanup
from ddpjob_rdzv import keys
from ddpjob_rdzv.client import EtcdConnection
from ddpjob_rdzv.settings import settings_from_conf
from ddpjob_sandbox.etcd import etcdctl, running_etcd
from ddpjob_sandbox.procs import free_port
from ddpjob_sandbox.readers import events, pod_names, status
from ddpjob_sandbox.scripted import set_running, set_terminated
from tests.cluster.installed_operator import audit_events, audit_offset
from tests.cluster.operators import RELEASE_ENV, status_manifest

pytestmark = pytest.mark.cluster

READ_SECRETS = pytest.mark.operator_values(**{"rbac.readSecrets": True})


KOPF_FINALIZER = "kopf.zalando.org/KopfFinalizerMarker"  # kopf's default finalizer name


@pytest.fixture(scope="module")
def etcd():
    with running_etcd() as server:
        yield server


def connect(endpoint: str, **conf) -> EtcdConnection:
    return EtcdConnection(settings_from_conf(endpoint, {"read_timeout": "5", **conf}))


def put_run_keys(endpoint: str, namespace: str, run_id: str, **conf) -> list[str]:
    """What agents of a job in ``namespace`` leave behind: the state key and a store key of one generation."""
    written = [keys.state_key(namespace, run_id), keys.store_prefix(namespace, run_id, 7) + "MASTER_ADDR"]
    connection = connect(endpoint, **conf)
    try:
        for key in written:
            connection.call("test write", lambda client, key=key: client.put(key, b"x"))
    finally:
        connection.close()
    return written


def existing(endpoint: str, wanted: list[str], **conf) -> list[str]:
    connection = connect(endpoint, **conf)
    try:
        return [key for key in wanted if connection.call("test read", lambda client, key=key: client.get(key))[1]]
    finally:
        connection.close()


def etcd_job(name: str, endpoints: list[str], **elastic) -> dict:
    return status_manifest(name, replicas=1, elasticPolicy={"rdzvBackend": "etcd-v3", "rdzvEndpoints": endpoints, **elastic})


def reasons(kube, job: str, kind: tuple[str, str]) -> list[str]:
    return [message for type_, reason, message in events(kube, job) if (type_, reason) == kind]


def placed_pod(kube, job: str) -> str:
    """The job's one node pod, once the scheduler placed it (a kubelet reports only then)."""
    pod = f"{job}-node-0"
    kube.wait_for(lambda: pod_names(kube, job) == [pod] and kube.get("pods", pod)["spec"].get("nodeName"),
                  timeout=15, what="the node pod placed")
    return pod


CLEANED = ("Normal", etcd_cleanup.REASON_CLEANED)
FAILED = ("Warning", etcd_cleanup.REASON_CLEANUP_FAILED)


@pytest.fixture
def etcd_with_auth():
    """An etcd with auth on: user ``trainer`` may read and write /ddpjob/rdzv/ only."""
    with running_etcd() as server:
        etcdctl(server, "user", "add", "root", "--new-user-password=rootpw")
        etcdctl(server, "user", "add", "trainer", "--new-user-password=s3cret")
        etcdctl(server, "role", "add", "rdzv")
        etcdctl(server, "role", "grant-permission", "rdzv", "--prefix=true", "readwrite", "/ddpjob/rdzv/")
        etcdctl(server, "user", "grant-role", "trainer", "rdzv")
        etcdctl(server, "auth", "enable")
        yield server


def create_secret(kube, name: str, data: dict[str, str]) -> None:
    body = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "type": "Opaque",
            "data": {key: base64.b64encode(value.encode()).decode() for key, value in data.items()}}
    kube.create("secrets", body)




def test_a_finished_job_loses_its_keys_and_only_its_keys(etcd, operator):
    kube, job = operator.kube, operator.job
    uid = kube.create("ddpjobs", etcd_job(job, [etcd.endpoint]))["metadata"]["uid"]
    pod = placed_pod(kube, job)
    ours = put_run_keys(etcd.endpoint, kube.namespace, uid)
    other = put_run_keys(etcd.endpoint, kube.namespace, f"other-{uid}")
    same_id_elsewhere = put_run_keys(etcd.endpoint, "another-namespace", uid)
    set_running(kube, pod)
    time.sleep(0.5)
    assert existing(etcd.endpoint, ours) == ours, "a running job's keys were deleted"

    set_terminated(kube, pod, 0)

    kube.wait_for(lambda: existing(etcd.endpoint, ours) == [], timeout=15, what="the job's keys deleted")
    assert existing(etcd.endpoint, other) == other
    assert existing(etcd.endpoint, same_id_elsewhere) == same_id_elsewhere
    assert status(kube, job)["phase"] == "Succeeded"
    messages = kube.wait_for(lambda: reasons(kube, job, CLEANED), timeout=10, what="a RendezvousKeysDeleted Event")
    assert messages == [f"deleted 2 etcd key(s) of the rendezvous under /ddpjob/rdzv/{kube.namespace}/{uid}/ "
                        f"at {etcd.endpoint}"]


def test_only_etcd_v3_jobs_carry_the_cleanup_finalizer(etcd, operator):
    kube, job, plain = operator.kube, operator.job, operator.name("plain")
    kube.create("ddpjobs", etcd_job(job, [etcd.endpoint]))
    kube.create("ddpjobs", status_manifest(plain, replicas=1))
    kube.wait_for(lambda: pod_names(kube, plain) == [f"{plain}-node-0"] and pod_names(kube, job) == [f"{job}-node-0"],
                  timeout=15, what="both jobs' pods")

    finalizers = kube.wait_for(lambda: kube.get("ddpjobs", job)["metadata"].get("finalizers"), timeout=10,
                               what="the etcd job's finalizer")
    assert finalizers == [KOPF_FINALIZER]
    assert not kube.get("ddpjobs", plain)["metadata"].get("finalizers")


@READ_SECRETS
def test_deleting_a_running_job_deletes_its_keys_with_the_credentials_of_its_secret(etcd_with_auth, operator):
    kube, job = operator.kube, operator.job
    secret = operator.name("etcd-client")
    create_secret(kube, secret, {"username": "trainer\n", "password": "s3cret\n"})
    auth = {"username": "trainer", "password": "s3cret", "allow_insecure_credentials": "true"}
    # The test etcd is plaintext: the job must allow its password to travel in the clear.
    uid = kube.create("ddpjobs", etcd_job(job, [etcd_with_auth.endpoint], rdzvSecretName=secret,
                                          rdzvAllowInsecureCredentials=True))["metadata"]["uid"]
    pod = placed_pod(kube, job)
    volumes = {v["name"]: v for v in kube.get("pods", pod)["spec"]["volumes"]}
    assert volumes["rdzv-credentials"]["secret"]["secretName"] == secret  # (the API server adds defaultMode)
    ours = put_run_keys(etcd_with_auth.endpoint, kube.namespace, uid, **auth)
    set_running(kube, pod)
    kube.wait_for(lambda: kube.get("ddpjobs", job)["metadata"].get("finalizers"), timeout=10, what="the finalizer")

    kube.delete("ddpjobs", job)

    kube.wait_for(lambda: kube.find("ddpjobs", job) is None, timeout=20, what="the job deleted")
    assert existing(etcd_with_auth.endpoint, ours, **auth) == []
    assert reasons(kube, job, CLEANED) and not reasons(kube, job, FAILED)


@READ_SECRETS
def test_the_operator_never_sends_a_password_in_plaintext_unless_the_job_allows_it(etcd_with_auth, operator):
    kube, job = operator.kube, operator.job
    secret = operator.name("etcd-client")
    create_secret(kube, secret, {"username": "trainer\n", "password": "s3cret\n"})  # no ca.crt
    uid = kube.create("ddpjobs", etcd_job(job, [etcd_with_auth.endpoint], rdzvSecretName=secret))["metadata"]["uid"]
    pod = placed_pod(kube, job)
    auth = {"username": "trainer", "password": "s3cret", "allow_insecure_credentials": "true"}
    ours = put_run_keys(etcd_with_auth.endpoint, kube.namespace, uid, **auth)

    set_terminated(kube, pod, 0)

    refused = kube.wait_for(lambda: reasons(kube, job, FAILED), timeout=20, what="a Warning about the refused cleanup")
    assert refused == [
        f"could not delete the etcd rendezvous keys under /ddpjob/rdzv/{kube.namespace}/{uid}/ at "
        f"{etcd_with_auth.endpoint} (spec.elasticPolicy.rdzvEndpoints): rdzv_conf username ('trainer') and "
        "password would travel to etcd in plaintext: no ca_cert is set (a rdzvSecretName Secret without "
        "ca.crt). Add the CA of etcd's server certificate as ca_cert (the Secret's ca.crt) to use TLS, or "
        "accept plaintext on a network you trust with rdzv_conf allow_insecure_credentials=true "
        "(spec.elasticPolicy.rdzvAllowInsecureCredentials: true); the operator tries again when the job is deleted"]
    assert existing(etcd_with_auth.endpoint, ours, **auth) == ours


def test_an_unreachable_etcd_is_reported_and_the_deletion_completes_within_its_bound(operator):
    assert RELEASE_ENV[etcd_cleanup.TIMEOUT_ENV] == "1"  # the bound below assumes 1 s attempts
    kube, job = operator.kube, operator.job
    dead = f"127.0.0.1:{free_port()}"
    kube.create("ddpjobs", etcd_job(job, [dead]))
    set_terminated(kube, placed_pod(kube, job), 0)
    on_finish = kube.wait_for(lambda: reasons(kube, job, FAILED), timeout=20, what="a Warning about the finish cleanup")
    assert "could not delete the etcd rendezvous keys under /ddpjob/rdzv/" in on_finish[0]
    assert f"at {dead} (spec.elasticPolicy.rdzvEndpoints)" in on_finish[0]
    assert on_finish[0].endswith("the operator tries again when the job is deleted")

    started = time.monotonic()
    kube.delete("ddpjobs", job)
    kube.wait_for(lambda: kube.find("ddpjobs", job) is None, timeout=40, what="the deletion to complete")
    took = time.monotonic() - started
    sys.stdout.write(f"\n--- operator log ---\n{operator.installed.operator_log(6000)}\n")

    # 3 attempts of ~1 s and 2 pauses of 2 s, plus kopf's own latency.
    assert took < 20, f"deletion took {took:.1f} s"
    gave_up = [m for m in reasons(kube, job, FAILED) if "gave up after 3 attempts" in m]
    assert len(gave_up) == 1 and "the keys expire with their lease" in gave_up[0]


def secret_reads(control_plane, since: int, account: str, namespace: str, secret: str) -> list[int]:
    """The response codes of ``account``'s reads of Secret ``namespace/secret`` after audit offset ``since``."""
    return [e["responseStatus"]["code"] for e in audit_events(control_plane, since)
            if e["user"]["username"] == account and e["verb"] == "get"
            and ((e.get("objectRef") or {}).get("resource"), e["objectRef"].get("namespace"), e["objectRef"].get("name"))
            == ("secrets", namespace, secret)]


def test_without_the_right_to_read_its_secret_the_cleanup_is_skipped_at_once_naming_the_chart_value(
        etcd, control_plane, operator):
    # The chart's default RBAC for this namespace: no rbac.readSecrets, so reading a Secret is a 403
    # from the real API server.
    kube, job = operator.kube, operator.job
    secret = operator.name("etcd-client")
    since = audit_offset(control_plane)
    create_secret(kube, secret, {"username": "trainer\n", "password": "s3cret\n"})
    uid = kube.create("ddpjobs", etcd_job(job, [etcd.endpoint], rdzvSecretName=secret))["metadata"]["uid"]
    pod = placed_pod(kube, job)
    ours = put_run_keys(etcd.endpoint, kube.namespace, uid)
    set_terminated(kube, pod, 0)

    skipped = kube.wait_for(lambda: reasons(kube, job, FAILED), timeout=15, what="a Warning about the skipped cleanup")
    assert skipped == [
        f"skipped deleting the etcd rendezvous keys under /ddpjob/rdzv/{kube.namespace}/{uid}/: "
        "the operator may not read Secret "
        f"{kube.namespace}/{secret} (spec.elasticPolicy.rdzvSecretName); set the chart value "
        f"rbac.readSecrets=true to let it; meanwhile the keys expire with their lease (rdzv_conf lease_ttl)"]
    assert existing(etcd.endpoint, ours) == ours

    kube.delete("ddpjobs", job)
    kube.wait_for(lambda: kube.find("ddpjobs", job) is None, timeout=20, what="the job deleted")

    # One try on finish, one on delete and no retry (each would read the Secret again), one Warning.
    # The audit log is written as requests complete: wait for both, then check none came after.
    reads = lambda: secret_reads(control_plane, since, operator.account, kube.namespace, secret)  # noqa: E731
    kube.wait_for(lambda: len(reads()) >= 2, timeout=10, what="the operator's two reads in the audit log")
    time.sleep(1)
    assert reads() == [403, 403]
    assert len(reasons(kube, job, FAILED)) == 1 and not reasons(kube, job, CLEANED)
