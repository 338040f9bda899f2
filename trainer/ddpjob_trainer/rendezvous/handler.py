"""torchrun's entry into the etcd v3 backend: builds torch's dynamic rendezvous handler on etcd v3.

See :mod:`.settings` for the ``--rdzv_conf`` keys read besides torch's own
(join/last_call/close timeouts, keep_alive_*), which ``create_handler`` reads.
"""
from __future__ import annotations

from torch.distributed.elastic.rendezvous.api import RendezvousParameters
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

from ddpjob_rdzv import keys
from ddpjob_rdzv.client import EtcdConnection, EtcdSettings
from ddpjob_rdzv.settings import settings_from_conf
from ddpjob_trainer.rendezvous.backend import EtcdV3RendezvousBackend
from ddpjob_trainer.rendezvous.early import create_early_handler
from ddpjob_trainer.rendezvous.store import EtcdV3Store


def create_rdzv_handler(params: RendezvousParameters, warm=None) -> DynamicRendezvousHandler:
    """torch's dynamic rendezvous handler on the etcd v3 backend, re-rendezvous completing early
    (.early); ``warm``: the node's prestarted fork server (zygote.Warm), if any."""
    connection = EtcdConnection(settings_from_params(params))
    # The operator sets DDPJOB_NAMESPACE in every node pod: the keys live under the job's namespace.
    backend = EtcdV3RendezvousBackend(connection, params.run_id, keys.namespace_from_env())
    store = EtcdV3Store(connection, backend)
    return create_early_handler(store, backend, params, warm)


def settings_from_params(params: RendezvousParameters) -> EtcdSettings:
    return settings_from_conf(params.endpoint, {key: params.get(key) for key in params.config})
