"""A c10d :class:`Store` on etcd v3, returned with the rendezvous (agents exchange MASTER_ADDR/PORT and ranks).

Keys live under ``/ddpjob/rdzv/<namespace>/<run_id>/store/<generation>/`` (see
:mod:`ddpjob_rdzv.keys`) and carry the agent's lease.

Blocking reads sit on the critical path of every rendezvous: MASTER_ADDR/PORT,
then torch's rank assignment (every agent writes its role, agent 0 reads them
all and writes every agent's ranks, every agent reads its own). A blocking read
therefore watches the store prefix and re-reads as soon as anything is written
there, instead of waking on a poll timer (which cost up to 100 ms per wait,
about 0.13 s per rendezvous of 8 agents). A slow poll stays as a safety net: a
watch does not survive an etcd restart or an endpoint fail-over, a poll does.
Multi-key reads and writes are one transaction each (a single fsync in etcd),
split only at etcd's limit of operations per transaction.
"""
from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta

from torch.distributed import Store
from torch.distributed.elastic.rendezvous.api import RendezvousStateError

from ddpjob_rdzv import keys
from ddpjob_rdzv.client import EtcdConnection
from ddpjob_trainer.rendezvous.backend import EtcdV3RendezvousBackend, call_for_torch

logger = logging.getLogger(__name__)

# Without a watch a blocking get/wait looks for its keys after 10 ms, then backs off to 100 ms:
# most keys of a round appear within milliseconds of each other, and polling agents share the
# node's cores with training. With a watch, a write wakes the reader at once and the poll only
# guards against a lost watch, so it backs off further.
_MIN_POLL_INTERVAL_S = 0.01
_MAX_POLL_INTERVAL_S = 0.1
_WATCHED_POLL_INTERVAL_S = 1.0
# etcd's default --max-txn-ops: more operations in one transaction are rejected.
_MAX_TXN_OPS = 128


class EtcdV3Store(Store):
    """The store of one rendezvous; its namespace follows the backend's state generation."""

    def __init__(self, connection: EtcdConnection, backend: EtcdV3RendezvousBackend,
                 timeout: timedelta | None = None) -> None:
        super().__init__()  # the pybind trampoline needs it
        self._connection = connection
        self._backend = backend
        if timeout is not None:
            self.set_timeout(timeout)

    def set(self, key, value) -> None:
        etcd_key = self._key(key)
        data = _as_bytes(value)
        call_for_torch(
            self._connection,
            "store write",
            lambda client: client.put(etcd_key, data, lease=self._connection.lease_id(client)),
        )

    def get(self, key) -> bytes:
        return self._wait_for([key], self.timeout)[0]

    def multi_get(self, keys_: list) -> list[bytes]:
        return self._wait_for(keys_, self.timeout)

    def multi_set(self, keys_: list, values: list) -> None:
        """All pairs in one transaction per _MAX_TXN_OPS keys (agent 0 writes every agent's ranks at once)."""
        pairs = [(self._key(key), _as_bytes(value)) for key, value in zip(keys_, values)]
        for chunk in _chunks(pairs):
            def operation(client, chunk=chunk):
                lease = self._connection.lease_id(client)
                puts = [client.transactions.put(key, data, lease=lease) for key, data in chunk]
                client.transaction(compare=[], success=puts, failure=[])
            call_for_torch(self._connection, "store write", operation)

    def wait(self, keys_: list, timeout: timedelta | None = None) -> None:
        self._wait_for(keys_, self.timeout if timeout is None else timeout)

    def check(self, keys_: list) -> bool:
        return all(value is not None for value in self._read(keys_))

    def add(self, key, amount: int) -> int:
        """Atomically adds ``amount`` to the decimal integer at ``key`` (0 when missing); returns the sum."""
        etcd_key = self._key(key)
        while True:
            value, meta = call_for_torch(self._connection, "store read", lambda client: client.get(etcd_key))
            total = int(value or b"0") + amount
            if self._swap(etcd_key, meta, str(total).encode()):
                return total

    def compare_set(self, key, expected, desired) -> bytes:
        """c10d semantics: writes ``desired`` if the value is ``expected`` (or missing and ``expected`` is
        empty); returns the value now stored, or ``expected`` when the key is missing and was not created."""
        etcd_key = self._key(key)
        expected_b, desired_b = _as_bytes(expected), _as_bytes(desired)
        while True:
            value, meta = call_for_torch(self._connection, "store read", lambda client: client.get(etcd_key))
            if (value if meta is not None else b"") != expected_b:
                return value if meta is not None else expected_b
            if self._swap(etcd_key, meta, desired_b):
                return desired_b

    def delete_key(self, key) -> bool:
        etcd_key = self._key(key)
        return bool(call_for_torch(self._connection, "store delete", lambda client: client.delete(etcd_key)))

    def num_keys(self) -> int:
        prefix = self._prefix()
        return call_for_torch(
            self._connection, "store count", lambda client: sum(1 for _ in client.get_prefix(prefix, keys_only=True))
        )

    def _swap(self, etcd_key: str, meta, data: bytes) -> bool:
        """Writes ``data`` if ``etcd_key`` is unchanged since ``meta`` was read (None: still missing)."""
        def operation(client):
            txn = client.transactions
            compare = txn.mod(etcd_key) == meta.mod_revision if meta is not None else txn.version(etcd_key) == 0
            lease = self._connection.lease_id(client)
            succeeded, _ = client.transaction(compare=[compare], success=[txn.put(etcd_key, data, lease=lease)],
                                              failure=[])
            return succeeded
        return call_for_torch(self._connection, "store compare-and-swap", operation)

    def _wait_for(self, keys_: list, timeout: timedelta) -> list[bytes]:
        deadline = time.monotonic() + timeout.total_seconds()
        values = self._read(keys_)
        if all(value is not None for value in values):
            return values
        written = threading.Event()
        # Watch first, then read again: a write between the two reads is seen by the second,
        # a write after it by the watch, so no write is missed.
        watch = self._watch(written)
        longest_pause = _MAX_POLL_INTERVAL_S if watch is None else _WATCHED_POLL_INTERVAL_S
        pause = _MIN_POLL_INTERVAL_S
        try:
            while True:
                values = self._read(keys_)
                if all(value is not None for value in values):
                    return values
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = [str(k) for k, v in zip(keys_, values) if v is None]
                    raise LookupError(
                        f"etcd store keys {missing} under {self._prefix()} did not appear within {timeout}"
                    )
                written.wait(min(pause, left))
                written.clear()
                pause = min(pause * 2, longest_pause)
        finally:
            _cancel(watch)

    def _watch(self, written: threading.Event):
        """(client, watch id) of a watch on the store prefix that sets ``written``; None if it failed."""
        prefix = self._prefix()

        def operation(client):
            # Called from etcd3's watch thread with a response or an error: either way, read again.
            return client, client.add_watch_prefix_callback(prefix, lambda _response: written.set())

        try:
            return self._connection.call("store watch", operation)
        except Exception as exc:  # noqa: BLE001 - polling still works without the watch
            logger.info("watching %s failed (%s); polling instead", prefix, exc)
            return None

    def _read(self, keys_: list) -> list[bytes | None]:
        """Reads all ``keys_`` in one round trip per _MAX_TXN_OPS keys (a transaction of gets); None if missing."""
        values: list[bytes | None] = []
        for chunk in _chunks([self._key(key) for key in keys_]):
            def operation(client, chunk=chunk):
                _, responses = client.transaction(
                    compare=[], success=[client.transactions.get(key) for key in chunk], failure=[]
                )
                return [found[0][0] if found else None for found in responses]

            values += call_for_torch(self._connection, "store read", operation)
        return values

    def _prefix(self) -> str:
        if self._backend.generation is None and self._backend.get_state() is None:
            raise RendezvousStateError(
                f"the etcd store of run '{self._backend.run_id}' was used before its rendezvous state "
                f"{self._backend.key} existed; the store is only valid after a rendezvous"
            )
        return keys.store_prefix(self._backend.namespace, self._backend.run_id, self._backend.generation)

    def _key(self, key) -> str:
        return self._prefix() + (key.decode() if isinstance(key, bytes) else str(key))


def _chunks(items: list) -> list[list]:
    return [items[i:i + _MAX_TXN_OPS] for i in range(0, len(items), _MAX_TXN_OPS)]


def _cancel(watch) -> None:
    """Best effort: after a fail-over the watch's client is already closed, and the watch with it."""
    if watch is None:
        return
    client, watch_id = watch
    try:
        client.cancel_watch(watch_id)
    except Exception as exc:  # noqa: BLE001 - nothing to do about a watch that is already gone
        logger.debug("cancelling store watch %s failed: %s", watch_id, exc)


def _as_bytes(value) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return bytes(value)
