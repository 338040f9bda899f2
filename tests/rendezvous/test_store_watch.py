"""The etcd v3 store on torch's critical path: blocking reads wake on a watch, multi-key ops are transactions."""
from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest

from ddpjob_trainer.rendezvous import store as store_module
from ddpjob_trainer.rendezvous.store import EtcdV3Store
from tests.rendezvous.test_backend import etcd, etcd_with_auth, make_backend  # noqa: F401  (fixtures)


def two_stores(etcd):  # noqa: F811
    """Two agents' views (separate connections, as in separate processes) of one run's store."""
    first = make_backend(etcd)
    first.set_state(b"v1")
    second = make_backend(etcd, run_id=first.run_id)
    second.get_state()
    return EtcdV3Store(first._connection, first), EtcdV3Store(second._connection, second)


def wait_in_thread(store, key: str, timeout: float = 20):
    woke: dict[str, float] = {}

    def run():
        store.wait([key], timedelta(seconds=timeout))
        woke["at"] = time.monotonic()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, woke


def test_a_waiting_reader_wakes_when_the_key_is_written_not_on_a_poll_timer(etcd, monkeypatch):  # noqa: F811
    monkeypatch.setattr(store_module, "_WATCHED_POLL_INTERVAL_S", 30.0)  # only the watch can wake it in time
    monkeypatch.setattr(store_module, "_MIN_POLL_INTERVAL_S", 30.0)
    reader, writer = two_stores(etcd)
    thread, woke = wait_in_thread(reader, "torchelastic/assigned_ranks/3")
    time.sleep(1.0)  # the reader has read, watched and is asleep

    written_at = time.monotonic()
    writer.set("torchelastic/assigned_ranks/3", "[3, 8, 3, 8]")
    thread.join(10)

    assert "at" in woke, "the write did not wake the reader"
    assert woke["at"] - written_at < 2.0
    assert reader.get("torchelastic/assigned_ranks/3") == b"[3, 8, 3, 8]"


def test_without_a_watch_the_reader_still_finds_the_key_by_polling(etcd, monkeypatch):  # noqa: F811
    monkeypatch.setattr(EtcdV3Store, "_watch", lambda self, written: None)
    reader, writer = two_stores(etcd)
    thread, woke = wait_in_thread(reader, "MASTER_ADDR")
    time.sleep(0.3)

    writer.set("MASTER_ADDR", "10.0.0.1")
    thread.join(10)

    assert "at" in woke


def test_a_wait_that_times_out_names_the_missing_key_and_leaves_no_watch_behind(etcd):  # noqa: F811
    reader, _ = two_stores(etcd)
    watcher = reader._connection.call("test", lambda client: client.watcher)

    with pytest.raises(LookupError, match="'never'"):
        reader.wait(["never"], timedelta(seconds=0.5))

    assert watcher._callbacks == {}


@pytest.mark.parametrize("count", [3, 300])  # 300: more than etcd's 128 operations per transaction
def test_multi_set_and_multi_get_cover_any_number_of_keys(etcd, count):  # noqa: F811
    reader, writer = two_stores(etcd)
    keys = [f"torchelastic/role_info/{i}" for i in range(count)]

    writer.multi_set(keys, [f"info-{i}" for i in range(count)])

    assert reader.multi_get(keys) == [f"info-{i}".encode() for i in range(count)]


def test_watches_work_with_username_and_password_on_a_plaintext_etcd(etcd_with_auth, monkeypatch):  # noqa: F811
    monkeypatch.setattr(store_module, "_WATCHED_POLL_INTERVAL_S", 30.0)  # only the watch can wake it in time
    monkeypatch.setattr(store_module, "_MIN_POLL_INTERVAL_S", 30.0)
    auth = {"username": "trainer", "password": "s3cret", "allow_insecure_credentials": "true"}
    first = make_backend(etcd_with_auth, **auth)
    first.set_state(b"v1")
    second = make_backend(etcd_with_auth, run_id=first.run_id, **auth)
    second.get_state()
    reader, writer = EtcdV3Store(first._connection, first), EtcdV3Store(second._connection, second)
    thread, woke = wait_in_thread(reader, "MASTER_PORT")
    time.sleep(1.0)

    writer.set("MASTER_PORT", "29500")
    thread.join(10)

    assert "at" in woke, "the write did not wake the reader: the watch failed with auth"
