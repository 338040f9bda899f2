"""The etcd v3 :class:`RendezvousBackend`: torch's rendezvous state in one key, written by compare-and-swap.

Token semantics follow torch's etcd-v2 and c10d backends: the fencing token is
the key's ``mod_revision``; ``set_state`` writes only if the key still has the
caller's revision (or, with no token, does not exist yet) and otherwise
returns the current state and token with ``False``. Each write attaches the
key to this agent's lease, so the state disappears ``lease_ttl`` seconds after
the last agent of a run stopped writing (torch heartbeats write every
``keep_alive_interval`` while any agent lives).
"""
from __future__ import annotations

from typing import Callable, TypeVar

from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError, RendezvousError
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousBackend, Token

from ddpjob_rdzv import BACKEND_NAME, keys
from ddpjob_rdzv.client import EtcdAccessError, EtcdConnection, EtcdUnreachableError


T = TypeVar("T")


def call_for_torch(connection: EtcdConnection, what: str, operation: Callable[[object], T]) -> T:
    """``connection.call`` raising torch's rendezvous errors, which torch's agent knows how to report."""
    try:
        return connection.call(what, operation)
    except EtcdUnreachableError as exc:
        raise RendezvousConnectionError(str(exc)) from exc
    except EtcdAccessError as exc:
        raise RendezvousError(str(exc)) from exc


class EtcdV3RendezvousBackend(RendezvousBackend):
    """Holds the rendezvous state of ``run_id`` at ``/ddpjob/rdzv/<namespace>/<run_id>/state``.

    Attributes:
        namespace: the job's namespace ("" outside a cluster), see :mod:`ddpjob_rdzv.keys`.
        generation: ``create_revision`` of the state key last seen (None before
            the first read); names the store's key space, see :mod:`ddpjob_rdzv.keys`.
    """

    def __init__(self, connection: EtcdConnection, run_id: str, namespace: str = "") -> None:
        self._connection = connection
        self.run_id = run_id
        self.namespace = namespace
        self.key = keys.state_key(namespace, run_id)  # validates both
        self.generation: int | None = None

    @property
    def name(self) -> str:
        return BACKEND_NAME

    def get_state(self) -> tuple[bytes, Token] | None:
        """See base class."""
        value, meta = call_for_torch(
            self._connection, "read of the rendezvous state", lambda client: client.get(self.key)
        )
        if meta is None:
            return None
        return self._remember(value, meta)

    def set_state(self, state: bytes, token: Token | None = None) -> tuple[bytes, Token, bool] | None:
        """See base class."""
        if token and not isinstance(token, int):
            # Not one of our tokens (torch's c10d backend uses bytes): it can never match, as in torch's backends.
            current = self.get_state()
            return None if current is None else (*current, False)
        succeeded, value, meta = call_for_torch(
            self._connection,
            "write of the rendezvous state",
            lambda client: self._compare_and_swap(client, state, token),
        )
        if meta is None:
            return None
        return (*self._remember(value, meta), succeeded)

    def _compare_and_swap(self, client, state: bytes, token: int | None):
        txn = client.transactions
        # With no token the key must not exist yet (version 0), else its revision must be the caller's.
        compare = txn.mod(self.key) == token if token else txn.version(self.key) == 0
        lease = self._connection.lease_id(client)
        succeeded, responses = client.transaction(
            compare=[compare],
            success=[txn.put(self.key, state, lease=lease), txn.get(self.key)],
            failure=[txn.get(self.key)],
        )
        found = responses[-1]
        if not found:
            return succeeded, None, None
        value, meta = found[0]
        return succeeded, value, meta

    def _remember(self, value: bytes, meta) -> tuple[bytes, Token]:
        self.generation = meta.create_revision
        return value, meta.mod_revision
