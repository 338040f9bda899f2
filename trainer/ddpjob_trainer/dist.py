"""The process group for one worker: set up from DistEnv, always torn down.

On a machine with CUDA each worker binds to GPU ``local_rank`` and uses
NCCL; without CUDA it uses gloo, so the same script runs in CPU-only tests.

Usage::

    from ddpjob_trainer import distributed

    with distributed() as env:      # init_process_group(...) ... destroy_process_group()
        train(env)
"""
from __future__ import annotations

import atexit
import contextlib
import datetime
import gc
import logging
import os
from collections.abc import Iterator, Mapping

import torch
import torch.distributed as torch_dist

from ddpjob_rdzv.contract import COLLECTIVE_TIMEOUT_ENV

from . import marks
from .env import DistEnv, dist_env
from .listen import EVERY_INTERFACE, listen_host, tcp_store_server

log = logging.getLogger(__name__)
marks.mark_imports_done()  # a worker imports this module right after torch (bench/recovery.py)

# Long enough for a slow snapshot write on rank 0 while the others wait in a
# collective; short enough that a hung peer fails the round instead of
# blocking until torchrun's own timeouts.
DEFAULT_TIMEOUT = datetime.timedelta(minutes=10)
# A DDPJob's pods set this from spec.failurePolicy.collectiveTimeoutSeconds (render/launch.py).


def collective_timeout(environ: Mapping[str, str] = os.environ) -> datetime.timedelta:
    """The process group's timeout: $DDPJOB_COLLECTIVE_TIMEOUT_SECONDS, else DEFAULT_TIMEOUT.

    Raises:
        ValueError: the variable is set but not a number of seconds above 0.
    """
    text = environ.get(COLLECTIVE_TIMEOUT_ENV, "")
    if not text:
        return DEFAULT_TIMEOUT
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds > 0 or seconds != seconds or seconds == float("inf"):
        raise ValueError(f"{COLLECTIVE_TIMEOUT_ENV} ({text!r}) must be a number of seconds above 0")
    return datetime.timedelta(seconds=seconds)


def backend_for(cuda_available: bool) -> str:
    """NCCL when the worker has a GPU, gloo otherwise."""
    return "nccl" if cuda_available else "gloo"


def device_for(env: DistEnv, cuda_available: bool | None = None) -> torch.device:
    """The device this worker trains on: ``cuda:<local_rank>`` or the CPU."""
    if cuda_available is None:
        cuda_available = torch.cuda.is_available()
    return torch.device("cuda", env.local_rank) if cuda_available else torch.device("cpu")


@contextlib.contextmanager
def distributed(env: DistEnv | None = None, timeout: datetime.timedelta | None = None) -> Iterator[DistEnv]:
    """Joins the process group described by ``env`` (read from torchrun when omitted).

    Every collective fails after ``timeout`` (default: collective_timeout(), which a DDPJob sets
    from spec.failurePolicy.collectiveTimeoutSeconds), so a stuck peer becomes an error that
    torchrun recovers from rather than a silent hang.

    The group is destroyed on every way out of the block, including
    exceptions, so a failed worker does not leave NCCL communicators behind.

    Yields:
        The DistEnv the group was built from.
    """
    env = env or dist_env()
    timeout = timeout if timeout is not None else collective_timeout()
    cuda = torch.cuda.is_available()
    backend = backend_for(cuda)
    device_id = None
    if cuda:
        # Before init: NCCL picks the current device for its communicator.
        torch.cuda.set_device(env.local_rank)
        device_id = torch.device("cuda", env.local_rank)
    store = group_store(env, timeout)
    torch_dist.init_process_group(
        backend=backend,
        init_method=None if store is not None else "env://",
        store=store,
        rank=env.rank,
        world_size=env.world_size,
        timeout=timeout,
        device_id=device_id,
    )
    log.debug("rank %d/%d joined the %s process group", env.rank, env.world_size, backend)
    release_process_groups_at_exit()
    marks.mark("process_group")
    try:
        yield env
        # Ranks leave the last collective at different moments: none tears its
        # side of the group down while a peer may still be sending to it. A
        # failing rank skips this: its peers must not wait.
        if torch_dist.is_initialized():
            torch_dist.barrier()
    finally:
        if torch_dist.is_initialized():
            torch_dist.destroy_process_group()


def group_store(env: DistEnv, timeout: datetime.timedelta,
                environ: Mapping[str, str] = os.environ) -> torch_dist.Store | None:
    """The process group's store at MASTER_ADDR:MASTER_PORT, as torch's env:// makes it, except
    that rank 0's server listens on DDPJOB_LISTEN_HOST only (torch's binds every interface);
    None where no listen host is set (a pod) or the agent serves the store: torch's env:// then.
    """
    host = listen_host(environ)
    if host in EVERY_INTERFACE or environ.get("TORCHELASTIC_USE_AGENT_STORE") == str(True):
        return None
    addr, port = environ["MASTER_ADDR"], int(environ["MASTER_PORT"])
    if env.rank == 0:
        store = tcp_store_server(host, port, world_size=env.world_size, timeout=timeout, multi_tenant=True)
    else:
        store = torch_dist.TCPStore(addr, port, world_size=env.world_size, is_master=False, timeout=timeout)
    # What init_process_group puts over the store it makes for env:// (keys apart from other users).
    return torch_dist.PrefixStore("default_pg", store)


def release_process_groups_at_exit() -> None:
    """Frees, at exit, the process groups that objects in reference cycles still hold.

    destroy_process_group() only forgets the group: a DistributedDataParallel
    wrapper keeps it alive (DDP sits in a reference cycle of its own, and so
    does the Trainer that holds it), so without this the gloo group and its
    worker threads are destroyed by the garbage collector during interpreter
    finalization. A gloo thread that then needs the GIL (to free a tensor it
    still holds) is ended with pthread_exit by CPython, whose unwinding through
    a noexcept C++ frame calls std::terminate: "terminate called without an
    active exception", exit -6, *after* training finished, and torchrun then
    restarted a finished job. One collection at exit (atexit handlers run
    before finalization, once the frames that held the Trainer are gone)
    destroys the group while the interpreter is whole; it costs ~0.1-0.3 s.
    """
    global _collect_at_exit
    if not _collect_at_exit:
        _collect_at_exit = True
        atexit.register(gc.collect)


_collect_at_exit = False  # whether the atexit collection is registered (once per process)
