"""torch elastic rendezvous on etcd's v3 API (``torchrun --rdzv_backend=etcd-v3``).

torch's own etcd backends speak only etcd's v2 API, which etcd 3.6 removed.
This backend keeps torch's dynamic rendezvous (the same join/keep-alive logic
as c10d) and stores its state in etcd v3; see :mod:`.keys` for the key
layout, :mod:`.backend` for the compare-and-swap, :mod:`.client` for endpoint
fail-over, TLS and auth, :mod:`.settings` for the ``--rdzv_conf`` keys and
:mod:`.cleanup` for deleting a job's keys without torch.

torch loads this package through the ``torchrun.handlers`` entry point while
``torch.distributed.elastic.rendezvous`` is still being imported, so nothing
heavy is imported here: the implementation (and etcd3/protobuf) load on first use.
"""
from __future__ import annotations

BACKEND_NAME = "etcd-v3"


def create_rdzv_handler(params):
    """See :func:`ddpjob_trainer.rendezvous.handler.create_rdzv_handler`."""
    from ddpjob_trainer.rendezvous.handler import create_rdzv_handler as create

    return create(params)


def delete_rendezvous(endpoints, run_id: str, **options) -> int:
    """See :func:`ddpjob_trainer.rendezvous.cleanup.delete_rendezvous` (imports no torch)."""
    from ddpjob_trainer.rendezvous.cleanup import delete_rendezvous as delete

    return delete(endpoints, run_id, **options)


def torchrun_handler_factory():
    """Target of the ``torchrun.handlers`` entry point: torch calls it and registers what it returns."""
    return create_rdzv_handler
