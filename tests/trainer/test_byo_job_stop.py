"""Job's graceful stop for a loop the Trainer does not run (the Hugging Face callback's): SIGTERM
to one of two gloo workers stops both at the same step, after that step's snapshot; the
signalled worker exits 143, its peer raises PeerStopped. Two plain processes (no torchrun, no
transformers), so it runs in the default suite; the HF callback's run of it under torchrun is
test_byo_huggingface_torchrun.py (slow)."""
import os
import subprocess
import sys

from ddpjob_sandbox.procs import free_port
from ddpjob_rdzv.contract import SNAPSHOT_DIR_ENV
from ddpjob_trainer.report.metrics import read_metrics
from ddpjob_trainer.snapshots.store import SnapshotStore
from ddpjob_trainer.stop import GRACEFUL_EXIT_CODE

WORKER = '''
import os, signal, sys
import torch
import torch.distributed as dist
from ddpjob_trainer import Job

signalled_rank, signalled_at = int(sys.argv[1]), int(sys.argv[2])
dist.init_process_group("gloo")
with Job() as job:
    job.load()
    job.watch_stop()
    for step in range(1, 50):
        job.step()
        if dist.get_rank() == signalled_rank and step == signalled_at:
            os.kill(os.getpid(), signal.SIGTERM)  # only a flag now
        if job.stop_agreed():
            job.save({"step": torch.tensor(step)}, epoch=0)
            job.stop_here(step)
'''


def test_sigterm_to_one_worker_stops_both_at_the_next_step_after_its_snapshot(tmp_path):
    (tmp_path / "worker.py").write_text(WORKER)
    port = free_port()
    workers = [
        subprocess.Popen([sys.executable, str(tmp_path / "worker.py"), "1", "3"], cwd=tmp_path, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={
                             **os.environ, SNAPSHOT_DIR_ENV: str(tmp_path / "snapshots"), "RANK": str(rank),
                             "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                             "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"})
        for rank in (0, 1)]
    outputs = [worker.communicate(timeout=120)[0] for worker in workers]
    # Rank 1 got SIGTERM during step 3; the vote started at step 3 is read at step 4 on both ranks.
    assert workers[1].returncode == GRACEFUL_EXIT_CODE, outputs[1][-3000:]
    assert workers[0].returncode == 1 and "PeerStopped: a peer stopped gracefully after step 4" in outputs[0], \
        outputs[0][-3000:]
    assert SnapshotStore(tmp_path / "snapshots").latest().step == 4
    events = read_metrics(tmp_path / "snapshots" / "metrics.jsonl")
    assert [e["step"] for e in events if e["event"] == "step"] == [1, 2, 3, 4]
    assert [(e["step"], e["signalled"]) for e in events if e["event"] == "stop"] == [(4, False)]  # rank 0 writes
