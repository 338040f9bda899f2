"""ddpjob_trainer.integrations.lightning on a tiny model built here (nothing downloaded): Lightning's
checkpoints go through SnapshotStore, a second fit resumes at the next epoch, steps are reported;
in one process, and (slow) as two DDP workers under torchrun."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

pl = pytest.importorskip("lightning.pytorch")  # the optional extra ddpjob-trainer[lightning]

import torch  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from ddpjob_trainer.integrations.lightning import DDPJobCallback  # noqa: E402
from ddpjob_rdzv.contract import SNAPSHOT_DIR_ENV  # noqa: E402
from ddpjob_trainer.report.metrics import read_metrics  # noqa: E402
from ddpjob_trainer.snapshots.store import SnapshotStore  # noqa: E402

BATCHES = 4  # per epoch


class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(3, 1)

    def training_step(self, batch, batch_idx):
        inputs, targets = batch
        return torch.nn.functional.mse_loss(self.layer(inputs), targets)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def data():
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(8 * BATCHES, 3, generator=generator)
    return DataLoader(TensorDataset(inputs, inputs.sum(dim=1, keepdim=True)), batch_size=8)


def fit(epochs):
    callback = DDPJobCallback()
    trainer = pl.Trainer(max_epochs=epochs, accelerator="cpu", devices=1, callbacks=[callback], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    model = Tiny()
    trainer.fit(model, data(), ckpt_path=callback.resume_path())
    return trainer, model


def test_a_second_fit_resumes_at_the_epoch_after_the_last_snapshot(tmp_path, monkeypatch):
    monkeypatch.setenv(SNAPSHOT_DIR_ENV, str(tmp_path))
    first, model = fit(epochs=2)
    latest = SnapshotStore(tmp_path).latest()
    assert (latest.epoch, latest.step) == (2, 2 * BATCHES)
    saved = SnapshotStore(tmp_path).load(latest)["state_dict"]["layer.weight"]
    assert torch.equal(saved, model.layer.weight.detach())

    second, _ = fit(epochs=3)
    assert second.global_step == 3 * BATCHES and SnapshotStore(tmp_path).latest().epoch == 3
    events = read_metrics(tmp_path / "metrics.jsonl")
    assert [(e["resume_epoch"], e["resume_step"]) for e in events if e["event"] == "start"] == [(0, 0), (2, 8)]
    assert [e["step"] for e in events if e["event"] == "step"] == list(range(1, 3 * BATCHES + 1))
    assert events[-1]["event"] == "done"


SCRIPT = '''
import sys
import lightning.pytorch as pl
from test_byo_lightning import Tiny, data
from ddpjob_trainer.integrations.lightning import DDPJobCallback

callback = DDPJobCallback()
trainer = pl.Trainer(max_epochs=int(sys.argv[1]), accelerator="cpu", devices=2, strategy="ddp", num_nodes=1,
                     callbacks=[callback], logger=False, enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False)
trainer.fit(Tiny(), data(), ckpt_path=callback.resume_path())
'''


@pytest.mark.slow  # ~40 s: two torchrun launches of two Lightning DDP workers each
def test_under_torchrun_with_ddp_rank_0_saves_and_every_rank_resumes(tmp_path):
    (tmp_path / "fit.py").write_text(SCRIPT)
    torchrun = Path(sys.executable).parent / "torchrun"
    env = {**os.environ, SNAPSHOT_DIR_ENV: str(tmp_path / "snapshots"),
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    for epochs in (1, 2):
        done = subprocess.run([str(torchrun), "--standalone", "--nproc_per_node", "2", str(tmp_path / "fit.py"),
                               str(epochs)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    events = read_metrics(tmp_path / "snapshots" / "metrics.jsonl")
    # 32 samples / 2 ranks / batch 8 = 2 steps per epoch
    assert [(e["resume_epoch"], e["resume_step"], e["world_size"]) for e in events if e["event"] == "start"] == [
        (0, 0, 2), (1, 2, 2)]
    assert [e["step"] for e in events if e["event"] == "step"] == [1, 2, 3, 4]
    assert SnapshotStore(tmp_path / "snapshots").latest().epoch == 2
