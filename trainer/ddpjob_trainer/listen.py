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
address is chosen (tcp_store_server). The binding rule itself lives in
ddpjob_rdzv/store_program.py, the store pod's self-contained program (`python -c`, in an image
that may not have ddpjob), and is imported from there: one rule, wherever it runs.
"""
from __future__ import annotations

from ddpjob_rdzv.contract import LISTEN_HOST_ENV, listen_host  # "" or unset: every interface; ddpjob run: 127.0.0.1
from ddpjob_rdzv.store_program import EVERY_INTERFACE, connect_host, listening_socket, tcp_store_server

__all__ = ["EVERY_INTERFACE", "LISTEN_HOST_ENV", "connect_host", "listen_host", "listening_socket",
           "tcp_store_server"]
