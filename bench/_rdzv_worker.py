"""Worker for bench.rendezvous: appends ``time rank world restart`` to $BENCH_UP_FILE, then exits or trains.

``--train`` keeps an all_reduce loop running (a job whose node can be
killed); without it the worker only reports that it started, before
importing torch, so the time measured is the launcher's, not torch's import.
"""
import os
import sys
import time


def report() -> None:
    with open(os.environ["BENCH_UP_FILE"], "a") as out:
        out.write(f"{time.time()} {os.environ['RANK']} {os.environ['WORLD_SIZE']} "
                  f"{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}\n")


def train_forever() -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    report()
    while True:
        dist.all_reduce(torch.ones(1))
        time.sleep(0.1)


if __name__ == "__main__":
    if "--train" in sys.argv:
        train_forever()
    else:
        report()
