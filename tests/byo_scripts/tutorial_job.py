"""tutorial_multinode.py adopting ddpjob_trainer.Job (docs/byo.md shows the difference).

Changed from the plain script: the snapshot goes through ``Job`` (atomic, verified, in
``$DDPJOB_SNAPSHOT_DIR``, with the optimizer), it stores the epoch to resume *at*, so a
resume never runs a saved epoch again, and every step is reported (status STEP, progress-aware
restart budget, ``ddpjob run --kill-node-after``).
"""
import argparse
import os
import time

import torch
import torch.nn.functional as F
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from ddpjob_trainer import Job
from tutorial_multinode import RandomPairs, ddp_setup

STEP_SLEEP = float(os.environ.get("TUTORIAL_STEP_SLEEP", "0"))


def train(job, model, loader, optimizer, device, total_epochs, save_every):
    for epoch in range(job.epoch, total_epochs):
        print(f"[RANK{job.rank}] Epoch {epoch} | Steps: {len(loader)}")
        loader.sampler.set_epoch(epoch)
        for source, targets in loader:
            optimizer.zero_grad()
            loss = F.mse_loss(model(source.to(device)), targets.to(device))
            loss.backward()
            optimizer.step()
            job.step(loss=loss.item(), epoch=epoch)
            time.sleep(STEP_SLEEP)
        if (epoch + 1) % save_every == 0 or epoch + 1 == total_epochs:
            job.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict()}, epoch=epoch + 1)
            if job.rank == 0:
                print(f"Epoch {epoch} | Training snapshot saved (resumes at epoch {epoch + 1})")


def main(save_every, total_epochs, batch_size):
    device = ddp_setup()
    dataset = RandomPairs(2048)
    model = torch.nn.Linear(20, 1).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    with Job(snapshot_dir="snapshots") as job:
        state = job.load(map_location=device)
        if state is not None:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            print(f"Resuming training from snapshot at Epoch {job.epoch}")
        model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
        loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, sampler=DistributedSampler(dataset))
        train(job, model, loader, optimizer, device, total_epochs, save_every)
    destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="simple distributed training job, resumable with ddpjob")
    parser.add_argument("total_epochs", type=int)
    parser.add_argument("save_every", type=int)
    parser.add_argument("--batch_size", default=32, type=int)
    args = parser.parse_args()
    main(args.save_every, args.total_epochs, args.batch_size)
