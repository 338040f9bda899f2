"""A c10d :class:`Store` on etcd v3, returned with the rendezvous (agents exchange MASTER_ADDR/PORT and ranks).

Keys live under ``/ddpjob/rdzv/<run_id>/store/<generation>/`` (see
:mod:`.keys`) and carry the agent's lease. Blocking reads poll: there are a
handful of them per rendezvous round, and a poll survives an etcd restart
where a watch stream would have to be re-established.
"""
from __future__ import annotations

import time
from datetime import timedelta

from torch.distributed import Store
from torch.distributed.elastic.rendezvous.api import RendezvousStateError

from ddpjob_rdzv import keys
from ddpjob_rdzv.client import EtcdConnection
from ddpjob_trainer.rendezvous.backend import EtcdV3RendezvousBackend, call_for_torch

# A blocking get/wait looks for its keys after 10 ms, then backs off to 100 ms: most keys of a
# round appear within milliseconds of each other, and polling agents share two cores with training.
_MIN_POLL_INTERVAL_S = 0.01
_MAX_POLL_INTERVAL_S = 0.1


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
        for key, value in zip(keys_, values):
            self.set(key, value)

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
        pause = _MIN_POLL_INTERVAL_S
        while True:
            values = self._read(keys_)
            if all(value is not None for value in values):
                return values
            if time.monotonic() >= deadline:
                missing = [str(k) for k, v in zip(keys_, values) if v is None]
                raise LookupError(
                    f"etcd store keys {missing} under {self._prefix()} did not appear within {timeout}"
                )
            time.sleep(pause)
            pause = min(pause * 2, _MAX_POLL_INTERVAL_S)

    def _read(self, keys_: list) -> list[bytes | None]:
        """Reads all ``keys_`` in one round trip (a transaction of gets); None for a missing key."""
        etcd_keys = [self._key(key) for key in keys_]

        def operation(client):
            _, responses = client.transaction(
                compare=[], success=[client.transactions.get(key) for key in etcd_keys], failure=[]
            )
            return [found[0][0] if found else None for found in responses]

        return call_for_torch(self._connection, "store read", operation)

    def _prefix(self) -> str:
        if self._backend.generation is None and self._backend.get_state() is None:
            raise RendezvousStateError(
                f"the etcd store of run '{self._backend.run_id}' was used before its rendezvous state "
                f"{self._backend.key} existed; the store is only valid after a rendezvous"
            )
        return keys.store_prefix(self._backend.run_id, self._backend.generation)

    def _key(self, key) -> str:
        return self._prefix() + (key.decode() if isinstance(key, bytes) else str(key))


def _as_bytes(value) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return bytes(value)
