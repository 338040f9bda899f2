"""The etcd v3 backend against a real etcd: CAS token semantics, leases, key layout, fail-over, auth."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist
from torch.distributed.elastic.rendezvous import RendezvousParameters, rendezvous_handler_registry
from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError, RendezvousError
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

from ddpjob_rdzv import delete_rendezvous, keys
from ddpjob_rdzv.client import EtcdConnection
from ddpjob_rdzv.settings import settings_from_conf
from ddpjob_trainer.rendezvous.backend import EtcdV3RendezvousBackend
from ddpjob_trainer.rendezvous.store import EtcdV3Store
from ddpjob_sandbox.etcd import etcdctl, running_etcd
from ddpjob_sandbox.procs import free_port
from ddpjob_sandbox.torchrun import unique_run_id


@pytest.fixture(scope="module")
def etcd():
    with running_etcd() as server:
        yield server


def connect(endpoint: str, **conf) -> EtcdConnection:
    return EtcdConnection(settings_from_conf(endpoint, {k: str(v) for k, v in conf.items()}))


def make_backend(etcd, run_id: str | None = None, **conf) -> EtcdV3RendezvousBackend:
    return EtcdV3RendezvousBackend(connect(etcd.endpoint, **conf), run_id or unique_run_id())


def raw_get(etcd, key: str):
    return connect(etcd.endpoint).call("test read", lambda client: client.get(key))


def test_a_new_run_has_no_state(etcd):
    assert make_backend(etcd).get_state() is None


def test_set_without_token_creates_the_state_once(etcd):
    first, second = make_backend(etcd, "run-create"), make_backend(etcd, "run-create")

    state, token, written = first.set_state(b"first")
    assert (state, written) == (b"first", True)

    assert second.set_state(b"second") == (b"first", token, False)
    assert second.get_state() == (b"first", token)


def test_set_with_the_current_token_writes_and_returns_a_new_token(etcd):
    backend = make_backend(etcd)
    _, token, _ = backend.set_state(b"v1")

    state, new_token, written = backend.set_state(b"v2", token)

    assert (state, written) == (b"v2", True)
    assert new_token != token
    assert backend.get_state() == (b"v2", new_token)


def test_set_with_a_stale_token_keeps_the_state_and_returns_the_current_one(etcd):
    backend = make_backend(etcd)
    _, stale, _ = backend.set_state(b"v1")
    _, current, _ = backend.set_state(b"v2", stale)

    assert backend.set_state(b"lost", stale) == (b"v2", current, False)
    assert backend.get_state() == (b"v2", current)


def test_only_one_of_two_agents_with_the_same_token_wins(etcd):
    run_id = unique_run_id()
    agent_a, agent_b = make_backend(etcd, run_id), make_backend(etcd, run_id)
    _, token, _ = agent_a.set_state(b"base")

    result_a = agent_a.set_state(b"from-a", token)
    result_b = agent_b.set_state(b"from-b", token)

    assert result_a[2] is True and result_b[2] is False
    assert result_b[:2] == result_a[:2]


def test_a_foreign_token_never_matches(etcd):
    backend = make_backend(etcd)
    _, token, _ = backend.set_state(b"v1")

    assert backend.set_state(b"v2", b"c10d-token") == (b"v1", token, False)


def test_set_with_a_token_after_the_state_was_deleted_returns_none(etcd):
    backend = make_backend(etcd)
    _, token, _ = backend.set_state(b"v1")
    delete_rendezvous(etcd.endpoint, backend.run_id)

    assert backend.set_state(b"v2", token) is None


def test_state_and_store_keys_live_under_the_run_prefix_and_carry_a_lease_with_the_configured_ttl(etcd):
    backend = make_backend(etcd, lease_ttl=120)
    backend.set_state(b"v1")
    EtcdV3Store(backend._connection, backend).set("MASTER_ADDR", "10.0.0.1")

    prefix = f"/ddpjob/rdzv/_local/{backend.run_id}/"  # a backend made outside a cluster: no namespace
    found = connect(etcd.endpoint).call("test list", lambda client: list(client.get_prefix(prefix)))
    names = sorted(meta.key.decode() for _, meta in found)
    assert names == [f"{prefix}state", f"{prefix}store/{backend.generation}/MASTER_ADDR"]
    for _, meta in found:
        assert meta.lease_id != 0
        lease = connect(etcd.endpoint).call("test lease", lambda client: client.get_lease_info(meta.lease_id))
        assert lease.grantedTTL == 120
        assert 100 < lease.TTL <= 120


def test_runs_with_different_ids_do_not_see_each_other(etcd):
    run_a, run_ab = make_backend(etcd, "run-a"), make_backend(etcd, "run-ab")
    run_a.set_state(b"a")

    assert run_ab.get_state() is None
    run_ab.set_state(b"ab")
    assert run_a.get_state()[0] == b"a"


def test_delete_rendezvous_removes_every_key_of_the_run_and_nothing_else(etcd):
    doomed, kept = make_backend(etcd, "doomed"), make_backend(etcd, "doomed-not")
    for backend in (doomed, kept):
        backend.set_state(b"state")
        EtcdV3Store(backend._connection, backend).set("MASTER_PORT", "29500")

    assert delete_rendezvous([etcd.endpoint], "doomed") == 2

    assert doomed.get_state() is None
    assert kept.get_state()[0] == b"state"
    assert EtcdV3Store(kept._connection, kept).get("MASTER_PORT") == b"29500"


def test_a_run_that_reuses_an_id_after_deletion_never_reads_the_old_store_keys(etcd):
    old = make_backend(etcd)
    old.set_state(b"old run")
    EtcdV3Store(old._connection, old).set("MASTER_PORT", "1111")
    delete_rendezvous(etcd.endpoint, old.run_id)
    old_generation = old.generation

    new = make_backend(etcd, old.run_id)
    new.set_state(b"new run")
    store = EtcdV3Store(new._connection, new)

    assert new.generation != old_generation
    assert store.check(["MASTER_PORT"]) is False


def test_store_implements_c10d_semantics_through_a_prefix_store(etcd):
    backend = make_backend(etcd)
    backend.set_state(b"v1")
    etcd_store = EtcdV3Store(backend._connection, backend)  # the PrefixStore does not keep it alive
    store = dist.PrefixStore("torch.rendezvous.x.0", etcd_store)

    store.set("key", "value")
    store.multi_set(["a", "b"], ["1", "2"])
    assert store.get("key") == b"value"
    assert store.multi_get(["a", "b"]) == [b"1", b"2"]
    assert (store.add("counter", 2), store.add("counter", 3)) == (2, 5)
    assert store.compare_set("key", "wrong", "new") == b"value"
    assert store.compare_set("key", "value", "new") == b"new"
    assert store.compare_set("missing", "", "created") == b"created"
    assert store.check(["key", "a"]) and not store.check(["key", "never"])
    started = time.monotonic()
    with pytest.raises(LookupError, match="never"):
        store.wait(["never"], timedelta(seconds=0.3))
    assert time.monotonic() - started < 2


def test_an_unreachable_endpoint_fails_within_read_timeout_naming_every_endpoint_tried():
    dead = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    backend = EtcdV3RendezvousBackend(connect(",".join(dead), read_timeout=2), unique_run_id())

    started = time.monotonic()
    with pytest.raises(RendezvousConnectionError) as raised:
        backend.get_state()

    assert time.monotonic() - started < 6
    message = str(raised.value)
    assert f"--rdzv_endpoint={dead[0]}, {dead[1]}" in message
    assert "read_timeout=2 s" in message
    for endpoint in dead:
        assert f"{endpoint} (unavailable" in message


def test_a_dead_first_endpoint_fails_over_to_the_next(etcd):
    dead = f"127.0.0.1:{free_port()}"
    backend = EtcdV3RendezvousBackend(connect(f"{dead},{etcd.endpoint}", read_timeout=10), unique_run_id())

    started = time.monotonic()
    state, token, written = backend.set_state(b"v1")

    assert written and backend.get_state() == (b"v1", token)
    assert time.monotonic() - started < 3


def test_a_call_made_while_etcd_is_down_succeeds_once_it_is_back(etcd):
    backend = make_backend(etcd, read_timeout=30)
    _, token, _ = backend.set_state(b"before")
    etcd.stop()
    comeback = threading.Timer(1.5, etcd.start)
    comeback.start()
    try:
        started = time.monotonic()
        result = backend.set_state(b"after", token)
    finally:
        comeback.join()

    assert result[::2] == (b"after", True)
    assert time.monotonic() - started >= 1.5


class CountedOpens:
    """In place of an etcd3 watcher's stub: counts the streams its thread opens."""

    def __init__(self, stub):
        self.stub, self.opened = stub, 0

    def Watch(self, requests, **kwargs):  # noqa: N802 - the gRPC stub's method name
        self.opened += 1
        return self.stub.Watch(requests, **kwargs)


def test_a_watch_thread_waits_between_tries_while_etcd_is_down_and_watches_again_once_it_is_back(etcd):
    """etcd3's watch thread used to open a new stream the moment the last one failed: while etcd
    was down, every process that had ever watched spun a core, starting a gRPC thread per try."""
    connection = connect(etcd.endpoint)
    seen = threading.Event()
    watch_id = connection.call("test watch", lambda client: client.add_watch_prefix_callback("/pace/", lambda _: None))
    watcher = connection.call("test", lambda client: client.watcher)
    counted = watcher._watch_stub = CountedOpens(watcher._watch_stub)
    etcd.stop()
    try:
        time.sleep(4)
        opened_while_down = counted.opened
    finally:
        etcd.start()
    # Pauses of 0, 0.1, 0.2, 0.4, 0.8, 1.6 s: six tries in the first 3.1 s, then one per 2 s.
    assert 1 <= opened_while_down <= 8, opened_while_down

    def watch_and_write():
        connection.call("test watch", lambda client: client.add_watch_prefix_callback("/pace/", lambda _: seen.set()))
        connection.call("test write", lambda client: client.put("/pace/key", "v"))
        return seen.wait(1)

    deadline = time.monotonic() + 15
    while not watch_and_write():
        assert time.monotonic() < deadline, "no watch saw a write after etcd came back"
    connection.call("test", lambda client: client.cancel_watch(watch_id))


def test_create_rdzv_handler_builds_torchs_dynamic_handler_on_etcd_v3_completing_early(etcd):
    params = RendezvousParameters("etcd-v3", etcd.endpoint, unique_run_id(), 1, 2, keep_alive_interval=2)

    handler = rendezvous_handler_registry.create_handler(params)

    assert handler.get_backend() == "etcd-v3"
    # torch's handler, whose re-rendezvous completes once every known node joined (rendezvous/early.py)
    assert type(handler).__name__ == "EarlyRendezvousHandler" and isinstance(handler, DynamicRendezvousHandler)
    assert handler.num_nodes_waiting() == 0


@pytest.fixture(scope="module")
def etcd_with_auth():
    """A second etcd (auth stays off on the shared one): user ``trainer`` may write /ddpjob/rdzv/ only."""
    with running_etcd() as server:
        etcdctl(server, "user", "add", "root", "--new-user-password=rootpw")
        etcdctl(server, "user", "add", "trainer", "--new-user-password=s3cret")
        etcdctl(server, "user", "add", "outsider", "--new-user-password=pw")
        etcdctl(server, "role", "add", "rdzv")
        etcdctl(server, "role", "grant-permission", "rdzv", "--prefix=true", "readwrite", "/ddpjob/rdzv/")
        etcdctl(server, "user", "grant-role", "trainer", "rdzv")
        etcdctl(server, "auth", "enable")
        yield server


# The test etcd with auth is plaintext: the password travels in the clear, which must be allowed explicitly.
PLAINTEXT_OK = {"allow_insecure_credentials": "true"}


def test_the_right_credentials_are_accepted_and_survive_an_etcd_restart(etcd_with_auth):
    backend = make_backend(etcd_with_auth, username="trainer", password="s3cret", read_timeout=30, **PLAINTEXT_OK)
    _, token, _ = backend.set_state(b"v1")

    # etcd forgets auth tokens when it restarts; the connection must authenticate again.
    etcd_with_auth.restart()

    assert backend.set_state(b"v2", token)[::2] == (b"v2", True)
    assert delete_rendezvous(etcd_with_auth.endpoint, backend.run_id, username="trainer", password="s3cret",
                             **PLAINTEXT_OK) == 1


def test_a_wrong_password_fails_at_once_naming_the_user(etcd_with_auth):
    backend = make_backend(etcd_with_auth, username="trainer", password="wrong", read_timeout=30, **PLAINTEXT_OK)

    started = time.monotonic()
    with pytest.raises(RendezvousError, match="rejected rdzv_conf username 'trainer'.*check the username and password"):
        backend.get_state()
    assert time.monotonic() - started < 5


def test_a_user_without_a_role_on_the_prefix_is_told_to_get_one(etcd_with_auth):
    backend = make_backend(etcd_with_auth, username="outsider", password="pw", **PLAINTEXT_OK)

    with pytest.raises(RendezvousError, match="denied rdzv_conf username 'outsider'.*grant it a role with readwrite"):
        backend.set_state(b"v1")


def test_missing_credentials_on_an_auth_enabled_etcd_are_reported(etcd_with_auth):
    with pytest.raises(RendezvousError, match="requires authentication: set rdzv_conf username and password"):
        make_backend(etcd_with_auth).get_state()


@pytest.mark.parametrize(
    ("endpoint", "conf", "message"),
    [
        ("", {}, "--rdzv_endpoint ('') must list etcd endpoints as host:port"),
        ("ftp://h:1", {}, "--rdzv_endpoint entry 'ftp://h:1' must use http:// or https://"),
        ("https://h:1", {}, "--rdzv_endpoint entry 'https://h:1' uses https but rdzv_conf ca_cert is not set"),
        ("h", {"read_timeout": "0"}, "rdzv_conf read_timeout ('0') must be an integer >= 1 (seconds)"),
        ("h", {"lease_ttl": "5"}, "rdzv_conf lease_ttl ('5') must be an integer >= 10 (seconds)"),
        ("h", {"lease_ttl": "soon"}, "rdzv_conf lease_ttl ('soon') must be an integer >= 10 (seconds)"),
        ("h", {"username": "u"}, "rdzv_conf username ('u') needs password or password_file"),
        ("h", {"ssl_cert": "/c.pem"}, "rdzv_conf ssl_cert ('/c.pem') and ssl_cert_key (None) must be given together"),
        ("h", {"ssl_cert": "/c", "ssl_cert_key": "/k"}, "rdzv_conf ssl_cert ('/c') needs ca_cert"),
        ("h", {"ca_cert": "/missing.pem"}, "rdzv_conf ca_cert ('/missing.pem') must name a readable file"),
        ("h", {"ca_cert": "/a", "ssl_ca_cert": "/b"}, "rdzv_conf ca_cert ('/a') and ssl_ca_cert ('/b') name different"),
        ("h", {"username": "u", "password_file": "/nope"}, "rdzv_conf password_file ('/nope') must be a readable file"),
    ],
)
def test_bad_settings_are_rejected_naming_the_key_value_and_rule(endpoint, conf, message):
    with pytest.raises(ValueError) as raised:
        settings_from_conf(endpoint, conf)
    assert message in str(raised.value)


def test_endpoints_parse_with_default_port_and_optional_scheme():
    settings = settings_from_conf("a:1, http://b ,[::1]:3,[fe80::2]", {})
    assert settings.endpoints == (("a", 1), ("b", 2379), ("::1", 3), ("fe80::2", 2379))


@pytest.mark.parametrize(
    ("endpoint", "message"),
    [
        ("h:0", "--rdzv_endpoint entry 'h:0' must end in a port between 1 and 65535"),
        ("h:x", "--rdzv_endpoint entry 'h:x' must end in a port between 1 and 65535"),
        (":2379", "--rdzv_endpoint entry ':2379' must name a host"),
        ("[::1", "--rdzv_endpoint entry '[::1' must be [IPv6] or [IPv6]:port"),
    ],
)
def test_bad_endpoints_are_rejected_naming_the_entry(endpoint, message):
    with pytest.raises(ValueError) as raised:
        settings_from_conf(endpoint, {})
    assert message in str(raised.value)


def test_password_file_is_read_without_its_trailing_newline(tmp_path):
    secret = tmp_path / "password"
    secret.write_text("s3cret\n")
    settings = settings_from_conf("h", {"username": "u", "password_file": str(secret), **PLAINTEXT_OK})
    assert settings.password == "s3cret"


def test_run_ids_that_could_overlap_another_prefix_are_rejected():
    with pytest.raises(ValueError, match=r"--rdzv_id \('a/state'\) must not contain '/'"):
        keys.run_prefix("team-a", "a/state")


def run_python(code: str, **env) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k != "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**clean, **env})


def test_etcd3_loads_in_a_fresh_process_without_changing_the_environment_workers_inherit():
    done = run_python(
        "import os; from ddpjob_rdzv import _etcd3; _etcd3.load();"
        "from google.protobuf.internal import api_implementation as a;"
        "print(a.Type(), os.environ.get('PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION'))"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["python", "None"]


def test_torchrun_discovers_the_backend_through_its_entry_point_in_a_fresh_process():
    done = run_python(
        "from torch.distributed.elastic.rendezvous import rendezvous_handler_registry as r;"
        "print(r._registry['etcd-v3'].__module__, 'google.protobuf' in __import__('sys').modules)"
    )
    assert done.returncode == 0, done.stderr
    # Registering must not import protobuf: that would fix its runtime before etcd3 needs it.
    assert done.stdout.split() == ["ddpjob_trainer.rendezvous", "False"]


def test_the_operator_can_delete_a_runs_keys_without_importing_torch(etcd):
    backend = make_backend(etcd)
    backend.set_state(b"v1")

    done = run_python(
        "import sys; from ddpjob_rdzv import delete_rendezvous;"
        f"print(delete_rendezvous({etcd.endpoint!r}, {backend.run_id!r}), 'torch' in sys.modules)"
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "False"]
    assert backend.get_state() is None


def test_delete_rendezvous_on_a_dead_endpoint_raises_a_plain_connection_error_naming_it():
    dead = f"127.0.0.1:{free_port()}"
    with pytest.raises(ConnectionError, match=f"--rdzv_endpoint={dead} answered within read_timeout=1 s"):
        delete_rendezvous(dead, "some-run", read_timeout=1)


def test_a_native_protobuf_loaded_first_gives_an_actionable_error():
    done = run_python(
        "import google.protobuf.descriptor_pool; from ddpjob_rdzv import _etcd3; _etcd3.load()"
    )
    assert done.returncode != 0
    assert "set PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python in the environment of the torchrun agent" in done.stderr
