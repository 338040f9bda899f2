"""Deletes a job's rendezvous keys; for the operator, so it imports neither torch nor kopf."""
from __future__ import annotations

from ddpjob_rdzv import keys
from ddpjob_rdzv.client import EtcdAccessError, EtcdConnection, EtcdUnreachableError
from ddpjob_rdzv.settings import settings_from_conf

__all__ = ["delete_rendezvous", "EtcdAccessError", "EtcdUnreachableError"]


def delete_rendezvous(endpoints: str | list[str], run_id: str, *, namespace: str = "", **options) -> int:
    """Deletes every etcd key of rendezvous ``run_id`` of ``namespace`` (state and store), exactly the
    prefix ``keys.run_prefix(namespace, run_id)``; returns how many were deleted.

    The operator calls this when a job is finished or deleted, so the id
    could be used again and nothing waits for the lease to expire.

    Args:
        endpoints: ``"host:port,host:port"`` or a list of ``host:port``.
        run_id: the job's ``--rdzv_id``.
        namespace: the job's namespace ("" for a local run, as the trainer's ``DDPJOB_NAMESPACE``).
        **options: the ``--rdzv_conf`` connection keys (``username``, ``password``, ``ca_cert``, ...).

    Raises:
        EtcdUnreachableError: no endpoint answered within ``read_timeout``.
        EtcdAccessError: etcd rejected the credentials or the permissions.
    """
    if not isinstance(endpoints, str):
        endpoints = ",".join(endpoints)
    settings = settings_from_conf(endpoints, {key: str(value) for key, value in options.items()})
    prefix = keys.run_prefix(namespace, run_id)
    connection = EtcdConnection(settings)
    try:
        return connection.call(f"delete of {prefix}", lambda client: _delete_prefix(client, prefix))
    finally:
        connection.close()


def _delete_prefix(client, prefix: str) -> int:
    return client.delete_prefix(prefix).deleted
