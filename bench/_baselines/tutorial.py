"""A bare elastic DDP script shaped like the PyTorch DDP tutorial's ``multinode.py``.

It is the recovery baseline for ``bench.trainer``: setup -> load objects ->
dataloader -> Trainer.train -> teardown, a snapshot of the model (no
optimizer) written in place every epoch, and on restart the saved epoch is
run again from its start. It deliberately keeps those weaknesses; the only
addition is a JSON-lines metrics file in ddpjob's format (``start`` and
``step`` events from rank 0) so the benchmark times both scripts the same way.

Run with torchrun: ``torchrun ... bench/_baselines/tutorial.py --epochs 5 --snapshot-dir DIR``.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def ddp_setup() -> None:
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(backend=backend)


def build_model(features: int, hidden: int, outputs: int) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(features, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, outputs))


def load_train_objs(args):
    generator = torch.Generator().manual_seed(args.seed)
    inputs = torch.randn(args.samples, args.features, generator=generator)
    targets = inputs @ torch.randn(args.features, args.outputs, generator=generator)
    model = build_model(args.features, args.hidden, args.outputs)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    return TensorDataset(inputs, targets), model, optimizer


class Trainer:
    def __init__(self, model, train_data, optimizer, snapshot_path, metrics_path, step_sleep):
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.global_rank = int(os.environ["RANK"])
        self.device = torch.device(f"cuda:{self.local_rank}" if torch.cuda.is_available() else "cpu")
        self.model = model.to(self.device)
        self.train_data = train_data
        self.optimizer = optimizer
        self.snapshot_path = snapshot_path
        self.metrics_path = metrics_path
        self.step_sleep = step_sleep
        self.epochs_run = 0
        if os.path.exists(snapshot_path):
            self._load_snapshot()
        # Steps whose work survives: the saved epoch itself runs again.
        self.step = self.epochs_run * len(train_data)
        self.model = DDP(self.model)
        self._emit(event="start", world_size=dist.get_world_size(),
                   restart_count=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)),
                   resume_epoch=self.epochs_run, resume_step=self.step)

    def _emit(self, **event) -> None:
        if self.global_rank == 0 and self.metrics_path:
            with open(self.metrics_path, "a") as out:
                now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")
                out.write(json.dumps({**event, "time": now}) + "\n")

    def _load_snapshot(self) -> None:
        snapshot = torch.load(self.snapshot_path, map_location=self.device)
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"]

    def _run_batch(self, source, targets, epoch) -> None:
        self.optimizer.zero_grad()
        loss = F.mse_loss(self.model(source), targets)
        loss.backward()
        self.optimizer.step()
        self.step += 1
        self._emit(event="step", epoch=epoch, step=self.step, loss=loss.item(),
                   world_size=dist.get_world_size())
        if self.step_sleep:
            time.sleep(self.step_sleep)

    def _run_epoch(self, epoch) -> None:
        self.train_data.sampler.set_epoch(epoch)
        for source, targets in self.train_data:
            self._run_batch(source.to(self.device), targets.to(self.device), epoch)

    def _save_snapshot(self, epoch) -> None:
        # As in the tutorial: written in place, and EPOCHS_RUN names the epoch
        # just finished, so a resume runs that epoch once more.
        snapshot = {"MODEL_STATE": self.model.module.state_dict(), "EPOCHS_RUN": epoch}
        torch.save(snapshot, self.snapshot_path)
        self._emit(event="snapshot", epoch=epoch, step=epoch * len(self.train_data), path=self.snapshot_path)

    def train(self, max_epochs: int) -> None:
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
            if self.global_rank == 0:
                self._save_snapshot(epoch)
        self._emit(event="done", epoch=max_epochs - 1, step=self.step)


@record
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--features", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--outputs", type=int, default=4)
    parser.add_argument("--snapshot-dir", required=True)
    parser.add_argument("--metrics-file", default="")
    parser.add_argument("--step-sleep", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    ddp_setup()
    dataset, model, optimizer = load_train_objs(args)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=False, sampler=DistributedSampler(dataset))
    snapshot_path = os.path.join(args.snapshot_dir, "snapshot.pt")
    Trainer(model, loader, optimizer, snapshot_path, args.metrics_file, args.step_sleep).train(args.epochs)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
