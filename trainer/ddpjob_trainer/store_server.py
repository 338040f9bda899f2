"""A standalone c10d rendezvous store: `python -m ddpjob_trainer.store_server --port 29400`.

torchrun's c10d backend normally runs its TCPStore inside one agent, so losing that node
ends the rendezvous for everyone (measured: the other agents exit within ~2 s). Run this
process instead (the operator's `<job>-rdzv` pod, `elasticPolicy.rdzvStore: pod`) and
start every agent with `is_host=false` in its rdzv conf: the store then outlives any
training node, and a lost node is replaced while the others keep their rendezvous.

It listens on ``--host`` only: torch's TCPStore would listen on every interface whatever host
it is given, so the socket is bound here and handed over (listen.tcp_store_server). ``ddpjob
run`` starts it with ``--host 127.0.0.1``; a store pod keeps the default, every interface.

The store keeps its keys in memory only; when this process dies the rendezvous state is
gone and the whole group must start a new rendezvous under a new id.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from datetime import timedelta
from typing import Any, Sequence

logger = logging.getLogger("ddpjob_trainer.store_server")

DEFAULT_PORT = 29400  # torchrun's conventional c10d rendezvous port


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m ddpjob_trainer.store_server", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="0.0.0.0",
                        help="address to listen on (default: every interface, IPv4 and IPv6)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"TCP port (default {DEFAULT_PORT})")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds a client request may wait on a key (TCPStore timeout)")
    return parser.parse_args(argv)


def start_store(host: str, port: int, timeout: float) -> Any:
    """The listening TCPStore server. wait_for_workers=False: agents come and go, the store
    must not wait for a fixed number of them; world_size stays unset for the same reason."""
    from .listen import tcp_store_server  # imports torch: here, not at import time, so `--help` stays instant

    return tcp_store_server(host, port, wait_for_workers=False, timeout=timedelta(seconds=timeout))


def serve(host: str, port: int, timeout: float, stop: threading.Event) -> None:
    """Run the store until `stop` is set."""
    store = start_store(host, port, timeout)
    # One line a person (or a readiness check reading logs) can rely on.
    print(f"ddpjob rendezvous store listening on {host}:{store.port}", flush=True)
    stop.wait()
    del store  # closes the listening socket before the process exits


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    stop = threading.Event()
    # SIGTERM is how the kubelet ends the pod; exit 0 so a deliberate stop is not a failure.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    serve(args.host, args.port, args.timeout, stop)
    logger.info("rendezvous store stopped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
