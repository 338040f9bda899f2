"""Example DDPJob: a small MLP learns a noisy linear map from synthetic data.

The data is generated from ``--seed`` alone (``y = x @ W + noise``), so every
rank, every restart and every node builds the same dataset without a shared
download, and the loss falls from about 16 (the variance of ``x @ W``) towards
the noise floor (0.01), which makes a broken training loop visible at once.

Run it with torchrun::

    torchrun --standalone --nproc_per_node=2 -m ddpjob_trainer.examples.mlp \\
        --epochs 3 --snapshot-dir /tmp/mlp --snapshot-every-steps 20

Kill it and run the same command again: it resumes from the newest complete
snapshot in ``/tmp/mlp`` and appends to ``/tmp/mlp/metrics.jsonl``.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.distributed.elastic.multiprocessing.errors import record
from torch.utils.data import TensorDataset

from ddpjob_rdzv.contract import METRICS_FILE_ENV, NODE_INDEX_ENV, SNAPSHOT_DIR_ENV
from ddpjob_trainer import DoNotRetry, Trainer, TrainerConfig, distributed

FEATURES = 16
OUTPUTS = 4
NOISE = 0.1
VALIDATION_SPLIT = 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m ddpjob_trainer.examples.mlp", description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, required=True, help="epochs to train in total")
    parser.add_argument("--samples", type=int, default=4096, help="training samples")
    parser.add_argument("--val-samples", type=int, default=512, help="validation samples (0 = no validation)")
    parser.add_argument("--batch-size", type=int, default=32, help="samples per rank per micro-step")
    parser.add_argument("--accumulation-steps", type=int, default=1, help="micro-steps per optimizer step")
    parser.add_argument("--lr", type=float, default=1e-2, help="Adam learning rate")
    parser.add_argument("--snapshot-dir", default=os.environ.get(SNAPSHOT_DIR_ENV),
                        help="shared snapshot directory (default $DDPJOB_SNAPSHOT_DIR)")
    parser.add_argument("--snapshot-every-epochs", type=int, default=1, help="0 = off")
    parser.add_argument("--snapshot-every-steps", type=int, default=0, help="0 = off")
    parser.add_argument("--snapshot-keep", type=int, default=2, help="complete snapshots to keep")
    parser.add_argument("--fast-snapshot-every-steps", type=int, default=TrainerConfig.fast_snapshot_every_steps,
                        help="also copy the state to /dev/shm every N steps (default %(default)s; 0 = off): "
                             "a SIGKILL loses at most N steps")
    parser.add_argument("--amp", action="store_true", help="mixed precision with a GradScaler (CUDA only)")
    parser.add_argument("--async-snapshot", action="store_true", help="write snapshots in a background thread")
    parser.add_argument("--metrics-file", default=os.environ.get(METRICS_FILE_ENV),
                        help="JSON-lines metrics (default $DDPJOB_METRICS_FILE, else SNAPSHOT_DIR/metrics.jsonl)")
    parser.add_argument("--step-sleep", type=float, default=0.0, help="testing: seconds to sleep after each step")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fail-at-step", type=int, default=None,
                        help="debugging: fail after this global step on the first attempt")
    parser.add_argument("--fault-node", default="0",
                        help="testing: DDPJOB_NODE_INDEX of the node that --hang-at-step and --slow-seconds act on")
    parser.add_argument("--hang-at-step", type=int, default=None,
                        help="testing: the fault node blocks forever after this step, once per snapshot directory "
                             "(it writes SNAPSHOT_DIR/hang-injected, holding the time, first)")
    parser.add_argument("--do-not-retry-at-step", type=int, default=None,
                        help="testing: the fault node raises DoNotRetry (reason InjectedFault) after this step")
    parser.add_argument("--slow-seconds", type=float, default=0.0,
                        help="testing: the fault node sleeps this long more after every step (a straggler)")
    parser.add_argument("--wait-for-world-size", type=int, default=None,
                        help="testing: a worker in a group of fewer ranks holds after its first step until torchrun "
                             "re-forms the group with a joining node (at most WAIT_FOR_WORLD_SECONDS)")
    parser.add_argument("--tensorboard-dir", default=None)
    parser.add_argument("--wandb-project", default=None)
    parser.add_argument("--no-progress-bar", action="store_true")
    args = parser.parse_args(argv)
    if args.metrics_file is None and args.snapshot_dir:
        args.metrics_file = os.path.join(args.snapshot_dir, "metrics.jsonl")
    return args


def make_dataset(samples: int, seed: int, split: int = 0) -> TensorDataset:
    """``samples`` pairs (x, x @ W + noise); W depends only on ``seed``, x also on ``split``."""
    weights = torch.randn(FEATURES, OUTPUTS, generator=torch.Generator().manual_seed(seed))
    generator = torch.Generator().manual_seed(seed + 1 + split)
    inputs = torch.randn(samples, FEATURES, generator=generator)
    targets = inputs @ weights + NOISE * torch.randn(samples, OUTPUTS, generator=generator)
    return TensorDataset(inputs, targets)


def make_model(seed: int) -> torch.nn.Module:
    # Same seed on every rank: identical initial weights even before DDP's broadcast.
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 64), torch.nn.ReLU(), torch.nn.Linear(64, OUTPUTS))


def mse(model: torch.nn.Module, batch) -> torch.Tensor:
    inputs, targets = batch
    return F.mse_loss(model(inputs), targets)


def config_from(args: argparse.Namespace) -> TrainerConfig:
    return TrainerConfig(
        epochs=args.epochs,
        batch_size=args.batch_size,
        accumulation_steps=args.accumulation_steps,
        seed=args.seed,
        snapshot_dir=args.snapshot_dir,
        snapshot_every_epochs=args.snapshot_every_epochs,
        snapshot_every_steps=args.snapshot_every_steps,
        snapshot_keep=args.snapshot_keep,
        fast_snapshot_every_steps=args.fast_snapshot_every_steps,
        async_snapshot=args.async_snapshot,
        amp=args.amp,
        metrics_file=args.metrics_file,
        tensorboard_dir=args.tensorboard_dir,
        wandb_project=args.wandb_project,
        progress_bar=not args.no_progress_bar,
    )


HANG_MARKER = "hang-injected"  # --hang-at-step: written in the snapshot directory before blocking
# --wait-for-world-size holds at most this long, then trains on: a test whose joining node never
# came then fails on the group sizes it reads from the metrics instead of hanging.
WAIT_FOR_WORLD_SECONDS = 240.0


def fault_injection(step_sleep: float, fail_at_step: int | None, restart_count: int,
                    args: argparse.Namespace | None = None, world_size: int = 1,
                    stopped: Callable[[], bool] = lambda: False) -> Callable[[int], None] | None:
    """The Trainer's on_step hook for the example's test flags: --step-sleep slows every step (so
    tests can kill a node mid-epoch), --fail-at-step raises after that step on the first attempt
    (TORCHELASTIC_RESTART_COUNT 0) to exercise the restart path; on the --fault-node only,
    --hang-at-step blocks forever once (a hang) and --slow-seconds slows every step (a
    straggler). --wait-for-world-size makes a worker of a group smaller than that hold after its
    first step (once the step is in the metrics) until `stopped()`: torchrun re-forms the group
    when a node joins, and SIGTERMs the workers, which the Trainer turns into a flag (stop.py),
    so the group finishes only in its full size whatever the machine's speed. None when no flag is set."""
    here = args is not None and os.environ.get(NODE_INDEX_ENV, "0") == args.fault_node
    hang_at = args.hang_at_step if here else None
    fatal_at = args.do_not_retry_at_step if here else None
    slow = args.slow_seconds if here else 0.0
    wanted = getattr(args, "wait_for_world_size", None)
    hold = wanted is not None and world_size < wanted
    if not step_sleep and fail_at_step is None and hang_at is None and fatal_at is None and not slow and not hold:
        return None
    first = [True]

    def on_step(step: int) -> None:
        if hold and first[0]:
            first[0] = False
            _wait_for_world(world_size, wanted, stopped)
        if fail_at_step == step and restart_count == 0:
            raise RuntimeError(f"fail_at_step={step}: failing on purpose on the first attempt (debugging flag)")
        if fatal_at == step:
            raise DoNotRetry(f"do_not_retry_at_step={step}: giving up on purpose (testing flag)", reason="InjectedFault")
        if hang_at == step:
            _hang_once(args.snapshot_dir, step)
        if step_sleep or slow:
            time.sleep(step_sleep + slow)

    return on_step


def _wait_for_world(world_size: int, wanted: int, stopped: Callable[[], bool]) -> None:
    """Holds a worker of a `world_size` group until torchrun stops it to re-form a bigger one."""
    logging.getLogger(__name__).warning("wait_for_world_size=%d: %d rank(s) hold until a node joins (testing flag)",
                                        wanted, world_size)
    deadline = time.monotonic() + WAIT_FOR_WORLD_SECONDS
    while not stopped() and time.monotonic() < deadline:
        time.sleep(0.05)


def _hang_once(snapshot_dir: str | None, step: int) -> None:
    """Blocks forever, unless an earlier run of this job (sharing ``snapshot_dir``) already did."""
    if snapshot_dir:
        try:
            with open(os.path.join(snapshot_dir, HANG_MARKER), "x") as marker:
                marker.write(f"{time.time()} {step}\n")
        except FileExistsError:
            return
    logging.getLogger(__name__).warning("hang_at_step=%d: blocking forever on purpose (testing flag)", step)
    while True:
        time.sleep(3600)


def _setup_logging(rank: int) -> None:
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format=f"%(asctime)s [rank {rank}] %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


@record
def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    config = config_from(args)
    with distributed() as env:
        _setup_logging(env.rank)
        model = make_model(args.seed)
        optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
        scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.999)
        val_data = make_dataset(args.val_samples, args.seed, split=VALIDATION_SPLIT) if args.val_samples else None
        trainer = Trainer(
            model, optimizer, make_dataset(args.samples, args.seed), config,
            loss_fn=mse, scheduler=scheduler, val_data=val_data, env=env,
            on_step=fault_injection(args.step_sleep, args.fail_at_step, env.restart_count, args, env.world_size,
                                    stopped=lambda: trainer.stop.requested),
        )
        result = trainer.train()
        if env.is_rank0:
            logging.getLogger(__name__).info(
                "finished: %d epochs, step %d, loss %.5f, validation loss %s",
                result.epochs, result.step, result.loss, result.validation_loss,
            )


if __name__ == "__main__":
    main()
