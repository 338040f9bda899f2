"""A tiny torchrun worker for rendezvous tests: an all_reduce loop that resumes from a progress file.

Rank 0 appends JSON lines (``start``, ``step``, ``done``) to ``--metrics-file``
in the shape of the trainer's metrics contract, so tests can use the shared
metrics watcher; each step's ``sum`` is the all_reduce of 1 from every rank,
which equals the world size only if every rank really joined the same group.
``--progress-file`` holds the last finished step, so a restarted worker group
continues instead of starting over (what a snapshot does for the trainer).
"""
import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist


def emit(path: Path, event: str, **fields) -> None:
    with open(path, "a") as out:
        out.write(json.dumps({"event": event, "time": time.time(), **fields}) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--step-sleep", type=float, default=0.2)
    parser.add_argument("--metrics-file", type=Path, required=True)
    parser.add_argument("--progress-file", type=Path, required=True)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    step = int(args.progress_file.read_text()) if args.progress_file.exists() else 0
    if rank == 0:
        emit(args.metrics_file, "start", world_size=world, resume_step=step,
             restart_count=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")))
    while step < args.steps:
        value = torch.ones(1)
        dist.all_reduce(value)
        step += 1
        if rank == 0:
            emit(args.metrics_file, "step", step=step, sum=int(value.item()), world_size=world)
            tmp = args.progress_file.with_suffix(".tmp")
            tmp.write_text(str(step))
            tmp.replace(args.progress_file)
        time.sleep(args.step_sleep)
    dist.barrier()
    if rank == 0:
        emit(args.metrics_file, "done", step=step, world_size=world)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
