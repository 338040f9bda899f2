"""ddpjob's c10d rendezvous store: a self-contained program, Python's standard library and torch only.

A store pod runs this file's text as `python -c <text> --port N` in the job's own image, so any
image with Python and torch can host the store; `ddpjob run` starts it the same way and
`python -m ddpjob_trainer.store_server` calls its main. Hence: no import of ddpjob, torch
imported only when the store starts, and short (it is in every store pod's spec).

torch's TCPStore listens on every interface whatever host it is given: the socket is bound
to --host here and handed over (master_listen_fd). The keys live in memory only: when this
process dies the rendezvous is gone and the whole group starts again under a new id.
"""
import argparse
import signal
import socket
import threading
from datetime import timedelta

DEFAULT_PORT = 29400  # torchrun's conventional c10d port
# Hosts meaning every interface: IPv4 and IPv6 where the machine has both, as torch would listen.
EVERY_INTERFACE = ("", "0.0.0.0", "::", "*")


def listening_socket(host, port):
    """A TCP socket listening on host:port (0: a free port); every interface for EVERY_INTERFACE.
    Raises OSError when the address cannot be bound (taken, not this machine's, unresolvable)."""
    if host in EVERY_INTERFACE:
        if socket.has_dualstack_ipv6():
            return socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True,
                                        backlog=socket.SOMAXCONN)
        return socket.create_server(("", port), backlog=socket.SOMAXCONN)
    family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    return socket.create_server(address[:2], family=family, backlog=socket.SOMAXCONN)


def connect_host(host):
    """An address this machine reaches a listener bound to host at (a wildcard: loopback)."""
    return "127.0.0.1" if host in EVERY_INTERFACE else host


def tcp_store_server(host, port, **options):
    """A TCPStore server on host:port only (0: a free port, see .port); options are TCPStore's."""
    import torch.distributed as dist

    server = listening_socket(host, port)
    bound = server.getsockname()[1]
    # The store owns the fd from here; not closed on failure: it may have taken it over already.
    return dist.TCPStore(connect_host(host), bound, is_master=True, master_listen_fd=server.detach(), **options)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="ddpjob rendezvous store", description="ddpjob's c10d rendezvous store")
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default: every interface)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"TCP port (default {DEFAULT_PORT})")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a client may wait on a key")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):  # the kubelet's stop is no failure: exit 0
        signal.signal(sig, lambda *_: stop.set())
    # Agents come and go: the store waits for no number of them (world_size unset).
    store = tcp_store_server(args.host, args.port, wait_for_workers=False, timeout=timedelta(seconds=args.timeout))
    print(f"ddpjob rendezvous store listening on {args.host}:{store.port}", flush=True)
    stop.wait()
    del store  # closes the listening socket before the process exits
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
