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
    SnapshotStore            atomic, verified snapshots (snapshot.py)
    ResumableSampler         mid-epoch resume at any world size (sampler.py)
    MetricsWriter, read_metrics   JSON-lines metrics with rollback (metrics.py)
    DoNotRetry               raise it to fail the job at once, without retries (errors.py)

Heavy modules (torch) are imported on first use, so ``from ddpjob_trainer
import dist_env`` stays cheap.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from .env import DistEnv, TorchrunEnvError, dist_env
from .errors import DoNotRetry, do_not_retry

__version__ = "0.1.0"

_LAZY = {
    "distributed": "dist",
    "Trainer": "trainer",
    "TrainerConfig": "trainer",
    "TrainResult": "trainer",
    "Job": "job",
    "SnapshotStore": "snapshot",
    "SnapshotInfo": "snapshot",
    "SnapshotError": "snapshot",
    "SnapshotsUnreadableError": "snapshot",
    "ResumableSampler": "sampler",
    "MetricsWriter": "metrics",
    "read_metrics": "metrics",
}

__all__ = ["DistEnv", "DoNotRetry", "TorchrunEnvError", "dist_env", "do_not_retry", *_LAZY]

if TYPE_CHECKING:
    from .dist import distributed
    from .job import Job
    from .metrics import MetricsWriter, read_metrics
    from .sampler import ResumableSampler
    from .snapshot import SnapshotError, SnapshotInfo, SnapshotsUnreadableError, SnapshotStore
    from .trainer import Trainer, TrainerConfig, TrainResult


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'ddpjob_trainer' has no attribute {name!r}")
