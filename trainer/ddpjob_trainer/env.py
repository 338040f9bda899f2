"""The distributed environment that torchrun hands to each worker process.

torchrun (``torch/distributed/run.py``) starts every worker with its rank,
world size and rendezvous details in environment variables. After a failure
or a membership change torchrun restarts *all* workers and the values change:
a worker that used to be rank 3 of 4 may come back as rank 1 of 2. So the
environment is read once per worker process, at start, and never stored on
disk or reused across restarts.

Usage::

    from ddpjob_trainer import dist_env

    env = dist_env()          # raises TorchrunEnvError outside torchrun
    if env.is_rank0:
        print(f"{env.world_size} workers, restart {env.restart_count}")

It also reads how snapshots are trusted and what to do when none can be read
(``DDPJOB_TRUST_SNAPSHOTS``, ``DDPJOB_SNAPSHOT_ON_UNREADABLE``; see snapshots/store.py).
"""
from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from ddpjob_rdzv.contract import SNAPSHOT_ON_UNREADABLE_ENV

# Variables torchrun always sets; without any of them the process was not
# started by torchrun and cannot join a process group.
REQUIRED_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")

# 1: load snapshots with torch.load(weights_only=False), which runs any code a snapshot holds.
TRUST_SNAPSHOTS_ENV = "DDPJOB_TRUST_SNAPSHOTS"
# SNAPSHOT_ON_UNREADABLE_ENV (the contract): Fail or StartOver when snapshots exist but none can be
# read; the operator renders it from spec.snapshot.onUnreadable.
ON_UNREADABLE_CHOICES = ("Fail", "StartOver")
_FLAGS = {"1": True, "true": True, "0": False, "false": False, "": False}


class TorchrunEnvError(RuntimeError):
    """The worker was not started by torchrun, or torchrun's variables are inconsistent."""


@dataclass(frozen=True)
class DistEnv:
    """One worker's view of the job, as torchrun described it at process start.

    Attributes:
        rank: global rank, 0..world_size-1 (changes across restarts).
        world_size: number of worker processes in this round (changes across restarts).
        local_rank: index of this worker on its node; selects the GPU.
        local_world_size: worker processes on this node.
        group_rank: index of this node (torchrun agent) in this round.
        restart_count: how often this node's agent restarted its workers
            (agents count separately, so nodes may disagree).
        run_id: the rendezvous id shared by every node of the job.
        master_addr: host of the rank-0 TCP store.
        master_port: port of the rank-0 TCP store.
    """

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    group_rank: int
    restart_count: int
    run_id: str
    master_addr: str
    master_port: int

    @property
    def is_rank0(self) -> bool:
        """True on the single worker that writes snapshots and metrics."""
        return self.rank == 0


def dist_env(environ: Mapping[str, str] | None = None, program: str | None = None) -> DistEnv:
    """Reads torchrun's variables from ``environ`` (default: ``os.environ``).

    Args:
        environ: variables to read; the process environment when omitted.
        program: what torchrun should run, shown in the error message;
            guessed from how Python was started when omitted.

    Returns:
        The worker's DistEnv.

    Raises:
        TorchrunEnvError: a variable is missing, not an integer, or out of range.
    """
    environ = os.environ if environ is None else environ
    for name in REQUIRED_VARIABLES:
        if name not in environ:
            raise TorchrunEnvError(_missing_message(name, program or _current_program()))
    env = DistEnv(
        rank=_int(environ, "RANK"),
        world_size=_int(environ, "WORLD_SIZE"),
        local_rank=_int(environ, "LOCAL_RANK"),
        local_world_size=_int(environ, "LOCAL_WORLD_SIZE"),
        # Set by torchrun's elastic agent; absent under older launchers, where
        # there was one node and no restart.
        group_rank=_int(environ, "GROUP_RANK", default=0),
        restart_count=_int(environ, "TORCHELASTIC_RESTART_COUNT", default=0),
        run_id=environ.get("TORCHELASTIC_RUN_ID", "none"),
        master_addr=environ["MASTER_ADDR"],
        master_port=_int(environ, "MASTER_PORT"),
    )
    _check_ranges(env)
    return env


def trust_snapshots(environ: Mapping[str, str] | None = None) -> bool:
    """Whether $DDPJOB_TRUST_SNAPSHOTS asks to load snapshots with weights_only=False (default: no).

    Raises:
        ValueError: the variable is set to something other than 1, 0, true or false.
    """
    raw = (os.environ if environ is None else environ).get(TRUST_SNAPSHOTS_ENV, "")
    if raw.strip().lower() not in _FLAGS:
        raise ValueError(f"environment variable {TRUST_SNAPSHOTS_ENV}={raw!r} must be 1 or 0 "
                         f"(1 loads snapshots with torch.load(weights_only=False))")
    return _FLAGS[raw.strip().lower()]


def snapshot_on_unreadable(environ: Mapping[str, str] | None = None) -> str:
    """$DDPJOB_SNAPSHOT_ON_UNREADABLE: Fail (the default) or StartOver.

    Raises:
        ValueError: the variable holds another value.
    """
    raw = (os.environ if environ is None else environ).get(SNAPSHOT_ON_UNREADABLE_ENV) or "Fail"
    if raw not in ON_UNREADABLE_CHOICES:
        raise ValueError(f"environment variable {SNAPSHOT_ON_UNREADABLE_ENV}={raw!r} must be one of "
                         f"{', '.join(ON_UNREADABLE_CHOICES)} (spec.snapshot.onUnreadable)")
    return raw


def _int(environ: Mapping[str, str], name: str, default: int | None = None) -> int:
    raw = environ.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise TorchrunEnvError(f"environment variable {name}={raw!r} must be an integer (torchrun sets it)") from None


def _check_ranges(env: DistEnv) -> None:
    if env.world_size < 1:
        raise TorchrunEnvError(f"environment variable WORLD_SIZE={env.world_size} must be >= 1")
    if not 0 <= env.rank < env.world_size:
        raise TorchrunEnvError(
            f"environment variable RANK={env.rank} must be in [0, WORLD_SIZE={env.world_size})"
        )
    if not 0 <= env.local_rank < env.local_world_size:
        raise TorchrunEnvError(
            f"environment variable LOCAL_RANK={env.local_rank} must be in [0, LOCAL_WORLD_SIZE={env.local_world_size})"
        )


def _missing_message(name: str, program: str) -> str:
    return (
        f"environment variable {name} is not set: start this program with torchrun, for example\n"
        f"  torchrun --standalone --nproc_per_node=2 {program}\n"
        f"(torchrun sets {', '.join(REQUIRED_VARIABLES)} for every worker)"
    )


def _current_program() -> str:
    """How to name this program on a torchrun command line (``-m pkg.mod`` or a script path)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    args = " ".join(sys.argv[1:])
    if spec is not None and spec.name:
        target = f"-m {spec.name.removesuffix('.__main__')}"
    else:
        target = sys.argv[0] if sys.argv and sys.argv[0] else "train.py"
    return f"{target} {args}".rstrip()
