"""The real operator deletes an etcd-v3 job's rendezvous keys from a REAL etcd, on finish and on delete.

Keys are written with the real layout (``ddpjob_rdzv.keys``) under the job's
uid, plus a key of another run that must survive. The operator runs against
the API emulator; the etcd is the pinned etcd 3.6 (ddpjob_sandbox/etcd.py), once
with user/password auth read from the job's ``rdzvSecretName`` Secret. A dead
endpoint proves a failed cleanup is reported as a Warning Event and never
holds up a deletion beyond its bound; the chart's default RBAC (no Secret
reads, enforced by the emulator) proves the cleanup is skipped at once, saying
which chart value to set.
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
from tests.charts.support import render
from ddpjob_sandbox.etcd import etcdctl, running_etcd
from ddpjob_sandbox.jobs import make_manifest
from ddpjob_sandbox.readers import events, pod_names, status
from ddpjob_sandbox.scripted import set_running, set_terminated
from ddpjob_sandbox.operator_process import OperatorProcess, operator_command
from ddpjob_sandbox.procs import free_port
from tests.support.rbac import Authorizer, grants_of


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


def etcd_job(endpoints: list[str], **elastic) -> dict:
    return make_manifest(replicas=1, elasticPolicy={"rdzvBackend": "etcd-v3", "rdzvEndpoints": endpoints, **elastic})


def reasons(k8s, kind: str) -> list[str]:
    return [message for type_, reason, message in events(k8s) if (type_, reason) == kind]


CLEANED = ("Normal", etcd_cleanup.REASON_CLEANED)
FAILED = ("Warning", etcd_cleanup.REASON_CLEANUP_FAILED)


def test_a_finished_job_loses_its_keys_and_only_its_keys(etcd, k8s, operator):
    uid = k8s.create("ddpjobs", etcd_job([etcd.endpoint]))["metadata"]["uid"]
    k8s.wait_for(lambda: pod_names(k8s) == ["mlp-node-0"], timeout=15, what="the node pod")
    ours = put_run_keys(etcd.endpoint, k8s.namespace, uid)
    other = put_run_keys(etcd.endpoint, k8s.namespace, f"other-{uid}")
    same_id_elsewhere = put_run_keys(etcd.endpoint, "another-namespace", uid)
    set_running(k8s, "mlp-node-0")
    time.sleep(0.5)
    assert existing(etcd.endpoint, ours) == ours, "a running job's keys were deleted"

    set_terminated(k8s, "mlp-node-0", 0)

    k8s.wait_for(lambda: existing(etcd.endpoint, ours) == [], timeout=15, what="the job's keys deleted")
    assert existing(etcd.endpoint, other) == other
    assert existing(etcd.endpoint, same_id_elsewhere) == same_id_elsewhere
    assert status(k8s)["phase"] == "Succeeded"
    messages = k8s.wait_for(lambda: reasons(k8s, CLEANED), timeout=10, what="a RendezvousKeysDeleted Event")
    assert messages == [f"deleted 2 etcd key(s) of the rendezvous under /ddpjob/rdzv/{k8s.namespace}/{uid}/ "
                        f"at {etcd.endpoint}"]


def test_only_etcd_v3_jobs_carry_the_cleanup_finalizer(etcd, k8s, operator):
    k8s.create("ddpjobs", etcd_job([etcd.endpoint]))
    k8s.create("ddpjobs", make_manifest(name="plain", replicas=1))
    k8s.wait_for(lambda: pod_names(k8s, "plain") == ["plain-node-0"] and pod_names(k8s) == ["mlp-node-0"],
                 timeout=15, what="both jobs' pods")

    finalizers = k8s.wait_for(lambda: k8s.get("ddpjobs", "mlp")["metadata"].get("finalizers"), timeout=10,
                              what="the etcd job's finalizer")
    assert finalizers == [KOPF_FINALIZER]
    assert not k8s.get("ddpjobs", "plain")["metadata"].get("finalizers")


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


def create_secret(k8s, name: str, data: dict[str, str]) -> None:
    body = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "type": "Opaque",
            "data": {key: base64.b64encode(value.encode()).decode() for key, value in data.items()}}
    k8s.request("POST", f"/api/v1/namespaces/{k8s.namespace}/secrets", body)


def test_deleting_a_running_job_deletes_its_keys_with_the_credentials_of_its_secret(etcd_with_auth, k8s, operator):
    create_secret(k8s, "etcd-client", {"username": "trainer\n", "password": "s3cret\n"})
    auth = {"username": "trainer", "password": "s3cret", "allow_insecure_credentials": "true"}
    # The test etcd is plaintext: the job must allow its password to travel in the clear.
    uid = k8s.create("ddpjobs", etcd_job([etcd_with_auth.endpoint], rdzvSecretName="etcd-client",
                                         rdzvAllowInsecureCredentials=True))["metadata"]["uid"]
    k8s.wait_for(lambda: pod_names(k8s) == ["mlp-node-0"], timeout=15, what="the node pod")
    pod = k8s.get("pods", "mlp-node-0")
    assert {"name": "rdzv-credentials", "secret": {"secretName": "etcd-client"}} in pod["spec"]["volumes"]
    ours = put_run_keys(etcd_with_auth.endpoint, k8s.namespace, uid, **auth)
    set_running(k8s, "mlp-node-0")
    k8s.wait_for(lambda: k8s.get("ddpjobs", "mlp")["metadata"].get("finalizers"), timeout=10, what="the finalizer")

    k8s.delete("ddpjobs", "mlp")

    k8s.wait_for(lambda: k8s.find("ddpjobs", "mlp") is None, timeout=20, what="the job deleted")
    assert existing(etcd_with_auth.endpoint, ours, **auth) == []
    assert reasons(k8s, CLEANED) and not reasons(k8s, FAILED)


def test_the_operator_never_sends_a_password_in_plaintext_unless_the_job_allows_it(etcd_with_auth, k8s, operator):
    create_secret(k8s, "etcd-client", {"username": "trainer\n", "password": "s3cret\n"})  # no ca.crt
    uid = k8s.create("ddpjobs", etcd_job([etcd_with_auth.endpoint], rdzvSecretName="etcd-client"))["metadata"]["uid"]
    k8s.wait_for(lambda: pod_names(k8s) == ["mlp-node-0"], timeout=15, what="the node pod")
    auth = {"username": "trainer", "password": "s3cret", "allow_insecure_credentials": "true"}
    ours = put_run_keys(etcd_with_auth.endpoint, k8s.namespace, uid, **auth)

    set_terminated(k8s, "mlp-node-0", 0)

    refused = k8s.wait_for(lambda: reasons(k8s, FAILED), timeout=20, what="a Warning about the refused cleanup")
    assert refused == [
        f"could not delete the etcd rendezvous keys under /ddpjob/rdzv/{k8s.namespace}/{uid}/ at "
        f"{etcd_with_auth.endpoint} (spec.elasticPolicy.rdzvEndpoints): rdzv_conf username ('trainer') and "
        "password would travel to etcd in plaintext: no ca_cert is set (a rdzvSecretName Secret without "
        "ca.crt). Add the CA of etcd's server certificate as ca_cert (the Secret's ca.crt) to use TLS, or "
        "accept plaintext on a network you trust with rdzv_conf allow_insecure_credentials=true "
        "(spec.elasticPolicy.rdzvAllowInsecureCredentials: true); the operator tries again when the job is deleted"]
    assert existing(etcd_with_auth.endpoint, ours, **auth) == ours


def test_an_unreachable_etcd_is_reported_and_the_deletion_completes_within_its_bound(cluster, k8s, tmp_path):  # noqa: F811
    dead = f"127.0.0.1:{free_port()}"
    process = OperatorProcess(cluster, operator_command(k8s.namespace), tmp_path / "operator.log",
                              env={etcd_cleanup.TIMEOUT_ENV: "1"})
    with process:
        k8s.create("ddpjobs", etcd_job([dead]))
        k8s.wait_for(lambda: pod_names(k8s) == ["mlp-node-0"], timeout=15, what="the node pod")
        set_terminated(k8s, "mlp-node-0", 0)
        on_finish = k8s.wait_for(lambda: reasons(k8s, FAILED), timeout=20, what="a Warning about the finish cleanup")
        assert "could not delete the etcd rendezvous keys under /ddpjob/rdzv/" in on_finish[0]
        assert f"at {dead} (spec.elasticPolicy.rdzvEndpoints)" in on_finish[0]
        assert on_finish[0].endswith("the operator tries again when the job is deleted")

        started = time.monotonic()
        k8s.delete("ddpjobs", "mlp")
        k8s.wait_for(lambda: k8s.find("ddpjobs", "mlp") is None, timeout=40, what="the deletion to complete")
        took = time.monotonic() - started
        log = process.log()
    sys.stdout.write(f"\n--- operator log ---\n{log[-6000:]}\n")

    # 3 attempts of ~1 s and 2 pauses of 2 s, plus kopf's own latency.
    assert took < 20, f"deletion took {took:.1f} s"
    gave_up = [m for m in reasons(k8s, FAILED) if "gave up after 3 attempts" in m]
    assert len(gave_up) == 1 and "the keys expire with their lease" in gave_up[0]
    assert "Traceback" not in log


def test_without_the_right_to_read_its_secret_the_cleanup_is_skipped_at_once_naming_the_chart_value(
        etcd, cluster, k8s, operator):  # noqa: F811
    # The chart's default RBAC for this namespace: no rbac.readSecrets, so reading a Secret is a 403.
    authorizer = Authorizer(grants_of(render({"watchNamespaces": [k8s.namespace]})))
    cluster.emulator.authorize = authorizer
    create_secret(k8s, "etcd-client", {"username": "trainer\n", "password": "s3cret\n"})
    uid = k8s.create("ddpjobs", etcd_job([etcd.endpoint], rdzvSecretName="etcd-client"))["metadata"]["uid"]
    k8s.wait_for(lambda: pod_names(k8s) == ["mlp-node-0"], timeout=15, what="the node pod")
    ours = put_run_keys(etcd.endpoint, k8s.namespace, uid)
    set_terminated(k8s, "mlp-node-0", 0)

    skipped = k8s.wait_for(lambda: reasons(k8s, FAILED), timeout=15, what="a Warning about the skipped cleanup")
    assert skipped == [
        f"skipped deleting the etcd rendezvous keys under /ddpjob/rdzv/{k8s.namespace}/{uid}/: "
        "the operator may not read Secret "
        f"{k8s.namespace}/etcd-client (spec.elasticPolicy.rdzvSecretName); set the chart value "
        f"rbac.readSecrets=true to let it; meanwhile the keys expire with their lease (rdzv_conf lease_ttl)"]
    assert existing(etcd.endpoint, ours) == ours

    k8s.delete("ddpjobs", "mlp")
    k8s.wait_for(lambda: k8s.find("ddpjobs", "mlp") is None, timeout=20, what="the job deleted")

    # One try on finish, one on delete and no retry (each would read the Secret again), one Warning.
    assert [str(a) for a in authorizer.denied] == [f"get core/secrets in {k8s.namespace}"] * 2
    assert len(reasons(k8s, FAILED)) == 1 and not reasons(k8s, CLEANED)
