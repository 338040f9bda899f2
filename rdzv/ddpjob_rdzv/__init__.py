"""The torch-free code shared by ddpjob's trainer and operator.

One definition of what both sides must agree on, in a distribution that depends on
neither torch nor pydantic, so the operator image never pulls torch:

* :mod:`.contract`: the contract between operator and trainer: every ``DDPJOB_*`` variable
  the operator renders and the trainer reads, and :mod:`.contract.progress_record`, the
  record a trainer publishes (termination message and ``GET /progress``) and the operator
  reads: its layout, size cap and validation;
* the torch-free half of the etcd v3 rendezvous: :mod:`.keys` (the etcd key layout of a
  run), :mod:`.settings` (the ``--rdzv_conf`` connection keys and the credentials
  directory a mounted Secret provides), :mod:`.client` (endpoint fail-over, TLS, auth) and
  :mod:`.cleanup` (``delete_rendezvous``, which the operator calls when a job finishes or
  is deleted). The torch side (the ``RendezvousBackend`` and the c10d store) lives in
  ``ddpjob_trainer.rendezvous``;
* :mod:`.process_start`: when a process started, from /proc (the operator's peering priority,
  the recovery benchmark's marks).

The distribution keeps its name, ``ddpjob-rdzv``: renaming it would change the install
requirement of both images and of every user's ``pip install ddpjob-trainer`` resolution for
no gain in what the code says (the module name, ``contract``, says it); its one dependency is
etcd3.
"""
from __future__ import annotations

BACKEND_NAME = "etcd-v3"  # torchrun --rdzv_backend value of ddpjob's backend
# torchrun --rdzv_backend value of torch's c10d backend with ddpjob's early re-rendezvous
# (ddpjob_trainer.rendezvous.early); `ddpjob run` uses it for rdzvBackend: c10d.
C10D_BACKEND_NAME = "ddpjob-c10d"


def delete_rendezvous(endpoints, run_id: str, *, namespace: str = "", **options) -> int:
    """See :func:`ddpjob_rdzv.cleanup.delete_rendezvous` (etcd3 is imported on first use)."""
    from ddpjob_rdzv.cleanup import delete_rendezvous as delete

    return delete(endpoints, run_id, namespace=namespace, **options)
