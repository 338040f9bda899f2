"""ddpjob_trainer: elastic, fault-tolerant PyTorch DDP training inside DDPJob pods.

Bring your own model and script; torchrun (started by the DDPJob pod, or by
you) supplies the distributed environment::

    import torch
    from torch.distributed.elastic.multiprocessing.errors import record
    from ddpjob_trainer import Trainer, TrainerConfig, distributed

    @record                                   # torchrun reports the failing rank's traceback
    def main():
        with distributed() as env:            # nccl + cuda:LOCAL_RANK on GPU, gloo on CPU
            model = build_model()
            optimizer = torch.optim.AdamW(model.parameters())
            config = TrainerConfig(epochs=10, batch_size=64,
                                   snapshot_dir=os.environ["DDPJOB_SNAPSHOT_DIR"],
                                   snapshot_every_steps=500,
                                   metrics_file="/snapshots/metrics.jsonl")
            Trainer(model, optimizer, dataset, config,
                    loss_fn=lambda model, batch: loss(model(batch[0]), batch[1])).train()

    if __name__ == "__main__":
        main()

    # torchrun --nnodes=1:4 --nproc_per_node=gpu --rdzv_backend=c10d \
    #          --rdzv_endpoint=HOST:29400 --rdzv_id=JOB train.py

Public API:
    DistEnv, dist_env()      torchrun's variables (env.py)
    distributed()            process-group context manager (dist.py)
    Trainer, TrainerConfig   the training loop (trainer.py)
    Job                      resume + progress for a loop of your own (job.py, docs/byo.md)
    SnapshotStore            atomic, verified snapshots (snapshots/store.py)
    ResumableSampler         mid-epoch resume at any world size (loop/sampler.py)
    MetricsWriter, read_metrics   JSON-lines metrics with rollback (report/metrics.py)
    DoNotRetry, do_not_retry fail the job at once, without retries (errors.py, report/give_up.py)

Rooms, lowest first (each imports only rooms below it; tests/trainer/test_import_layers.py):

    env, errors, listen, marks, stop, zygote_checks   the process and its settings
    dist, zygote, store_server, rdzv_store, rendezvous/   a worker's process group and launch
    snapshots/   store, directory snapshots, fast tier, agreeing on the snapshot to load, writer
    loop/        the Trainer's configuration, RNG streams and resumable sampler
    report/      the node's progress record, its HTTP server, heartbeats, giving up, metrics
    job.py       the one lifecycle: snapshots + report + metrics, wired once for every loop
    trainer.py   the Trainer: the Job plus a DDP loop
    integrations/  Lightning and Hugging Face on the Job

Heavy modules (torch) are imported on first use, so ``from ddpjob_trainer
import dist_env`` stays cheap.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from .env import DistEnv, TorchrunEnvError, dist_env
from .errors import DoNotRetry

__version__ = "0.1.0"

_LAZY = {
    "distributed": "dist",
    "Trainer": "trainer",
    "TrainerConfig": "loop.config",
    "TrainResult": "trainer",
    "Job": "job",
    "SnapshotStore": "snapshots.store",
    "SnapshotInfo": "snapshots.store",
    "SnapshotError": "snapshots.store",
    "SnapshotsUnreadableError": "snapshots.store",
    "ResumableSampler": "loop.sampler",
    "MetricsWriter": "report.metrics",
    "read_metrics": "report.metrics",
    "do_not_retry": "report.give_up",
}

__all__ = ["DistEnv", "DoNotRetry", "TorchrunEnvError", "dist_env", *_LAZY]

if TYPE_CHECKING:
    from .dist import distributed
    from .job import Job
    from .loop.config import TrainerConfig
    from .loop.sampler import ResumableSampler
    from .report.give_up import do_not_retry
    from .report.metrics import MetricsWriter, read_metrics
    from .snapshots.store import SnapshotError, SnapshotInfo, SnapshotsUnreadableError, SnapshotStore
    from .trainer import Trainer, TrainResult


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'ddpjob_trainer' has no attribute {name!r}")
