"""etcd-v3 keys live under the job's namespace, so one etcd role per tenant can cover exactly its jobs.

The layout tests are torch-free (``ddpjob_rdzv.keys`` is what the operator's
cleanup imports too); the etcd tests run the trainer's backend and store against
a real etcd: two jobs in two namespaces with the same rendezvous id never see
each other's keys, and deleting one job's keys leaves the other's.
"""
from __future__ import annotations

import pytest

from ddpjob_operator.api import constants as C
from ddpjob_rdzv import delete_rendezvous, keys
from ddpjob_sandbox.etcd import running_etcd

UID = "6f1c2a3e-0000-4000-8000-000000000001"


@pytest.mark.parametrize(("namespace", "run_id", "state", "store"), [
    ("team-a", UID, f"/ddpjob/rdzv/team-a/{UID}/state", f"/ddpjob/rdzv/team-a/{UID}/store/7/"),
    ("team-a", f"{UID}-2", f"/ddpjob/rdzv/team-a/{UID}-2/state", f"/ddpjob/rdzv/team-a/{UID}-2/store/7/"),
    ("", "mlp-20261123-aa9c88", "/ddpjob/rdzv/_local/mlp-20261123-aa9c88/state",
     "/ddpjob/rdzv/_local/mlp-20261123-aa9c88/store/7/"),
], ids=["job", "later rendezvous generation", "local run"])
def test_every_key_of_a_run_lives_under_its_namespace(namespace, run_id, state, store):
    assert keys.state_key(namespace, run_id) == state
    assert keys.store_prefix(namespace, run_id, 7) == store
    assert state.startswith(keys.run_prefix(namespace, run_id))
    assert keys.run_prefix(namespace, run_id).startswith(keys.namespace_prefix(namespace))


def test_the_tenant_prefix_is_what_docs_tell_an_etcd_role_to_grant():
    assert keys.namespace_prefix("team-a") == "/ddpjob/rdzv/team-a/"
    # A namespace is a DNS label: no namespace can share the local runs' prefix or cover another's.
    assert keys.namespace_prefix("") == "/ddpjob/rdzv/_local/"
    assert not keys.namespace_prefix("team-ab").startswith(keys.namespace_prefix("team-a"))


@pytest.mark.parametrize(("namespace", "run_id", "message"), [
    ("a/b", UID, "DDPJOB_NAMESPACE ('a/b') must not contain '/': it names one etcd key prefix"),
    ("team-a", "a/state", "--rdzv_id ('a/state') must not contain '/': it names one etcd key prefix"),
    ("team-a", "", "--rdzv_id must be a non-empty string (ddpjob uses the job's uid)"),
])
def test_names_that_would_escape_their_prefix_are_rejected(namespace, run_id, message):
    with pytest.raises(ValueError) as raised:
        keys.run_prefix(namespace, run_id)
    assert str(raised.value) == message


def test_the_trainer_reads_the_namespace_the_operator_renders():
    assert keys.NAMESPACE_ENV == C.ENV_NAMESPACE  # the contract between render/launch.py and the backend
    assert keys.namespace_from_env({C.ENV_NAMESPACE: "team-a"}) == "team-a"
    assert keys.namespace_from_env({}) == ""


# --- against a real etcd -------------------------------------------------------------------

@pytest.fixture(scope="module")
def etcd():
    with running_etcd() as server:
        yield server


def two_tenants(etcd, run_id: str):
    """The backend and store of one job in team-a and one in team-b, both with rendezvous id ``run_id``."""
    from ddpjob_trainer.rendezvous.backend import EtcdV3RendezvousBackend
    from ddpjob_trainer.rendezvous.store import EtcdV3Store
    from tests.rendezvous.test_backend import connect

    jobs = {}
    for namespace in ("team-a", "team-b"):
        backend = EtcdV3RendezvousBackend(connect(etcd.endpoint), run_id, namespace)
        jobs[namespace] = (backend, EtcdV3Store(backend._connection, backend))
    return jobs


def all_keys(etcd) -> list[str]:
    from tests.rendezvous.test_backend import connect

    found = connect(etcd.endpoint).call("test list", lambda client: list(client.get_prefix(keys.ROOT)))
    return sorted(meta.key.decode() for _, meta in found)


def test_two_jobs_with_the_same_id_in_two_namespaces_do_not_see_each_others_keys(etcd):
    jobs = two_tenants(etcd, UID)
    (a, a_store), (b, b_store) = jobs["team-a"], jobs["team-b"]

    a.set_state(b"team-a state")
    a_store.set("MASTER_ADDR", "10.0.0.1")
    assert b.get_state() is None  # team-b's first agent starts a rendezvous of its own
    _, _, written = b.set_state(b"team-b state")
    b_store.set("MASTER_ADDR", "10.0.0.2")

    assert written
    assert a.get_state()[0] == b"team-a state" and b.get_state()[0] == b"team-b state"
    assert (a_store.get("MASTER_ADDR"), b_store.get("MASTER_ADDR")) == (b"10.0.0.1", b"10.0.0.2")
    assert [k for k in all_keys(etcd) if f"/{UID}/" in k] == [
        f"/ddpjob/rdzv/team-a/{UID}/state", f"/ddpjob/rdzv/team-a/{UID}/store/{a.generation}/MASTER_ADDR",
        f"/ddpjob/rdzv/team-b/{UID}/state", f"/ddpjob/rdzv/team-b/{UID}/store/{b.generation}/MASTER_ADDR"]


def test_deleting_one_jobs_keys_leaves_the_other_namespaces_job_alone(etcd):
    run_id = f"{UID}-9"
    jobs = two_tenants(etcd, run_id)
    for backend, store in jobs.values():
        backend.set_state(b"state")
        store.set("MASTER_PORT", "29500")

    assert delete_rendezvous(etcd.endpoint, run_id, namespace="team-a") == 2

    (a, _), (b, b_store) = jobs["team-a"], jobs["team-b"]
    assert a.get_state() is None
    assert b.get_state()[0] == b"state" and b_store.get("MASTER_PORT") == b"29500"
    assert [k for k in all_keys(etcd) if run_id in k] == [
        f"/ddpjob/rdzv/team-b/{run_id}/state", f"/ddpjob/rdzv/team-b/{run_id}/store/{b.generation}/MASTER_PORT"]


def test_the_torchrun_handler_keeps_its_keys_under_DDPJOB_NAMESPACE(etcd, monkeypatch):
    from torch.distributed.elastic.rendezvous import RendezvousParameters, rendezvous_handler_registry

    from ddpjob_sandbox.torchrun import unique_run_id

    run_id = unique_run_id()
    monkeypatch.setenv(C.ENV_NAMESPACE, "team-c")  # what the operator renders into every node pod
    params = RendezvousParameters("etcd-v3", etcd.endpoint, run_id, 1, 1, last_call_timeout=1)
    handler = rendezvous_handler_registry.create_handler(params)

    handler.next_rendezvous()
    try:
        written = [k for k in all_keys(etcd) if run_id in k]
        assert written and all(k.startswith(f"/ddpjob/rdzv/team-c/{run_id}/") for k in written), written
        assert f"/ddpjob/rdzv/team-c/{run_id}/state" in written
    finally:
        handler.shutdown()
