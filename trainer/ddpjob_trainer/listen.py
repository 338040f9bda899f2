"""Where ddpjob's own TCP listeners listen: one rule for all of them.

ddpjob opens these: the rendezvous store (store_server.py, or node 0's c10d store under
``ddpjob-c10d``), each agent's liveness beacon (rendezvous/liveness.py), the progress
endpoint (report/server.py) and rank 0's worker store (dist.py). In a pod each must be
reachable at the pod's IP (the operator polls the progress port, peers probe beacons and
reach the stores), so there they listen on every interface, as before. ``ddpjob run`` sets
``DDPJOB_LISTEN_HOST=127.0.0.1`` (operator/ddpjob_operator/local/plan.py): on a developer's
machine nothing of a run is reachable from another host. The rendezvous store holds pickled
state every agent unpickles, so a writer from outside would run code in every agent.

torch's TCPStore binds every interface (IPv4 and IPv6 ``*:<port>``) whatever host it is
given; it accepts a socket that already listens (``master_listen_fd``), which is how the
address is chosen here (store_socket).
"""
from __future__ import annotations

import os
import socket
from collections.abc import Mapping

from ddpjob_rdzv.contract import LISTEN_HOST_ENV

# Hosts that mean "every interface": IPv4 and IPv6 where the machine has both, as torch's
# TCPStore listens by itself (a store pod's clients may reach it over either family).
EVERY_INTERFACE = ("", "0.0.0.0", "::", "*")


def listen_host(environ: Mapping[str, str] = os.environ) -> str:
    """The address ddpjob's listeners bind: $DDPJOB_LISTEN_HOST, "" (every interface) when unset."""
    return environ.get(LISTEN_HOST_ENV, "").strip()


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket listening on ``host``:``port`` (0: a free port); every interface for
    EVERY_INTERFACE.

    Raises:
        OSError: the address cannot be bound (taken, not this machine's, not resolvable).
    """
    if host in EVERY_INTERFACE:
        if socket.has_dualstack_ipv6():
            return socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True,
                                        backlog=socket.SOMAXCONN)
        return socket.create_server(("", port), backlog=socket.SOMAXCONN)
    family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    return socket.create_server(address[:2], family=family, backlog=socket.SOMAXCONN)


def connect_host(host: str) -> str:
    """An address this machine reaches a listener bound to ``host`` at (a wildcard: loopback)."""
    return "127.0.0.1" if host in EVERY_INTERFACE else host


def store_socket(host: str, port: int) -> tuple[int, int]:
    """(fd, port) of a socket listening on ``host``:``port`` for a TCPStore server to take over
    (``master_listen_fd``): the store owns and closes the fd from then on."""
    server = listening_socket(host, port)
    bound = server.getsockname()[1]
    return server.detach(), bound


def tcp_store_server(host: str, port: int, **options):
    """A TCPStore server listening on ``host``:``port`` only (0: a free port, see ``.port``);
    ``options``: TCPStore's (timeout, wait_for_workers, world_size, multi_tenant, ...)."""
    import torch.distributed as dist  # here: the beacon and progress server need no torch

    fd, bound = store_socket(host, port)
    # Not closed here if the store fails: whether it took the fd over by then is not known, and
    # closing a number another thread reused would close that thread's file.
    return dist.TCPStore(connect_host(host), bound, is_master=True, master_listen_fd=fd, **options)
