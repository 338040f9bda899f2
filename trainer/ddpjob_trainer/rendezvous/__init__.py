"""torch elastic rendezvous on etcd's v3 API (``torchrun --rdzv_backend=etcd-v3``).

torch's own etcd backends speak only etcd's v2 API, which etcd 3.6 removed.
This backend keeps torch's dynamic rendezvous (the same join/keep-alive logic
as c10d) and stores its state in etcd v3: :mod:`.backend` holds the
compare-and-swap, :mod:`.store` the c10d store the agents share. Both it and
``--rdzv_backend=ddpjob-c10d`` (torch's c10d backend) complete a re-rendezvous as soon as
every known node has joined (:mod:`.early`).

What does not need torch lives in the ``ddpjob-rdzv`` distribution
(:mod:`ddpjob_rdzv`): the key layout, the fail-over client with TLS and auth,
the ``--rdzv_conf`` connection keys and ``delete_rendezvous``, which the
operator calls without pulling torch into its image.

torch loads this package through the ``torchrun.handlers`` entry point while
``torch.distributed.elastic.rendezvous`` is still being imported, so nothing
heavy is imported here: the implementation (and etcd3/protobuf) load on first use.
"""
from __future__ import annotations

from ddpjob_rdzv import BACKEND_NAME  # noqa: F401  (one definition, shared with the operator)


def create_rdzv_handler(params):
    """See :func:`ddpjob_trainer.rendezvous.handler.create_rdzv_handler`."""
    from ddpjob_trainer.rendezvous.handler import create_rdzv_handler as create

    return create(params, _prestart_workers())


def _prestart_workers():
    """The agent creates its handler once, before its first rendezvous: the moment to start the
    node's worker fork server (spec.elasticPolicy.fastRestart), see ddpjob_trainer.zygote.prestart.
    Returns it (a zygote.Warm), or None without one."""
    from ddpjob_trainer.zygote import prestart

    return prestart()


def create_c10d_handler(params):
    """torch's c10d backend and store under the early re-rendezvous (``--rdzv_backend=ddpjob-c10d``)."""
    from ddpjob_trainer.rendezvous.early import create_early_handler

    backend, store = _c10d_backend(params)
    return create_early_handler(store, backend, params, _prestart_workers())


def _c10d_backend(params):
    """torch's ``create_backend(params)``, except that an agent hosting the store (``is_host=true``,
    as ddpjob renders it for node 0) listens on DDPJOB_LISTEN_HOST only where that is set (``ddpjob
    run``: loopback); torch's store would listen on every interface (ddpjob_trainer.listen)."""
    from datetime import timedelta

    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend, create_backend
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    from ddpjob_trainer.listen import EVERY_INTERFACE, listen_host, tcp_store_server

    host = listen_host()
    if host in EVERY_INTERFACE or not params.get_as_bool("is_host") or params.get("store_type", "tcp") != "tcp":
        return create_backend(params)
    _, port = parse_rendezvous_endpoint(params.endpoint, default_port=29400)  # torch's DEFAULT_PORT
    timeout = timedelta(seconds=params.get_as_int("read_timeout", 60))  # torch's default
    store = tcp_store_server(host, port, multi_tenant=True, timeout=timeout)
    return C10dRendezvousBackend(store, params.run_id), store


def c10d_handler_factory():
    """Target of the ``ddpjob-c10d`` ``torchrun.handlers`` entry point."""
    _prepare_agent()
    return create_c10d_handler


def torchrun_handler_factory():
    """Target of the ``torchrun.handlers`` entry point: torch calls it and registers what it returns."""
    _prepare_agent()
    return create_rdzv_handler


def _prepare_agent():
    """torch calls the factories above in every torchrun agent, whatever its backend: the one
    hook ddpjob-trainer has in an agent of torch's etcd backend, see zygote.prepare_agent."""
    from ddpjob_trainer.zygote import prepare_agent

    prepare_agent()
