"""The torch-free half of ddpjob's etcd v3 rendezvous, shared by the trainer and the operator.

One definition of what both sides must agree on: :mod:`.keys` (the etcd key
layout of a run), :mod:`.settings` (the ``--rdzv_conf`` connection keys and
the credentials directory a mounted Secret provides), :mod:`.client` (endpoint
fail-over, TLS, auth) and :mod:`.cleanup` (``delete_rendezvous``, which the
operator calls when a job finishes or is deleted). The torch side (the
``RendezvousBackend`` and the c10d store) lives in ``ddpjob_trainer.rendezvous``;
this distribution depends on etcd3 only, so the operator image never pulls torch.
"""
from __future__ import annotations

BACKEND_NAME = "etcd-v3"  # torchrun --rdzv_backend value of ddpjob's backend


def delete_rendezvous(endpoints, run_id: str, *, namespace: str = "", **options) -> int:
    """See :func:`ddpjob_rdzv.cleanup.delete_rendezvous` (etcd3 is imported on first use)."""
    from ddpjob_rdzv.cleanup import delete_rendezvous as delete

    return delete(endpoints, run_id, namespace=namespace, **options)
