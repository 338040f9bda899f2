"""The process group: gloo on CPU, nccl on GPU, torn down on every way out."""
import dataclasses
import datetime
import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch
import torch.distributed as torch_dist

from ddpjob_trainer.dist import backend_for, device_for, distributed, group_store
from ddpjob_trainer.env import DistEnv
from ddpjob_sandbox.procs import free_port
from tests.support.listeners import listeners


def single_worker(monkeypatch, local_rank=0) -> DistEnv:
    port = free_port()
    # init_method="env://" reads the store address from the environment, as under torchrun.
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    return DistEnv(rank=0, world_size=1, local_rank=local_rank, local_world_size=local_rank + 1, group_rank=0,
                   restart_count=0, run_id="test", master_addr="127.0.0.1", master_port=port)


@pytest.mark.parametrize(("cuda", "backend"), [(True, "nccl"), (False, "gloo")])
def test_the_backend_follows_the_device(cuda, backend):
    assert backend_for(cuda) == backend


def test_each_worker_trains_on_the_gpu_of_its_local_rank():
    env = DistEnv(rank=5, world_size=8, local_rank=1, local_world_size=4, group_rank=1, restart_count=0,
                  run_id="x", master_addr="h", master_port=1)
    assert device_for(env, cuda_available=True) == torch.device("cuda", 1)
    assert device_for(env, cuda_available=False) == torch.device("cpu")


def test_the_group_exists_inside_the_block_and_is_destroyed_after(monkeypatch):
    env = single_worker(monkeypatch)
    with distributed(env) as inside:
        assert inside is env
        assert torch_dist.is_initialized() and torch_dist.get_world_size() == 1
        assert torch_dist.get_backend() == backend_for(torch.cuda.is_available())
    assert not torch_dist.is_initialized()


PEER = textwrap.dedent("""
    import sys, time
    from ddpjob_trainer.dist import distributed
    from ddpjob_trainer.env import DistEnv
    env = DistEnv(rank=1, world_size=2, local_rank=0, local_world_size=1, group_rank=1, restart_count=0,
                  run_id="test", master_addr="127.0.0.1", master_port=int(sys.argv[1]))
    with distributed(env):
        time.sleep(float(sys.argv[2]))
        print(time.time(), flush=True)  # the moment this rank is done with the group
""")


def test_a_rank_leaving_cleanly_waits_for_its_peers_before_tearing_the_group_down(monkeypatch):
    env = dataclasses.replace(single_worker(monkeypatch), world_size=2)
    # The peer inherits MASTER_ADDR/MASTER_PORT that single_worker set for env://.
    peer = subprocess.Popen([sys.executable, "-c", PEER, str(env.master_port), "1.5"], stdout=subprocess.PIPE, text=True)
    try:
        with distributed(env):
            pass
        left = time.time()
        out, _ = peer.communicate(timeout=60)
    finally:
        peer.kill()
    assert peer.returncode == 0
    assert left >= float(out.split()[-1]), "rank 0 tore the group down while rank 1 was still using it"


def test_the_group_is_destroyed_when_training_raises(monkeypatch):
    with pytest.raises(ZeroDivisionError):
        with distributed(single_worker(monkeypatch)):
            1 / 0
    assert not torch_dist.is_initialized()


def test_the_trainer_refuses_to_start_without_a_process_group():
    from ddpjob_trainer import Trainer, TrainerConfig

    model = torch.nn.Linear(2, 1)
    with pytest.raises(RuntimeError, match=r"Trainer needs a process group: construct it inside `with ddpjob_trainer.distributed\(\):`"):
        Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), [], TrainerConfig(epochs=1), loss_fn=None)


@pytest.mark.gpu
def test_on_a_gpu_the_group_uses_nccl_and_binds_the_local_rank(monkeypatch):
    with distributed(single_worker(monkeypatch)):
        assert torch_dist.get_backend() == "nccl"
        assert torch.cuda.current_device() == 0
    assert not torch_dist.is_initialized()


def test_with_a_listen_host_rank_0s_group_store_listens_there_only(monkeypatch):
    """torch's env:// would have rank 0's store listen on every interface (`ddpjob run` sets
    DDPJOB_LISTEN_HOST=127.0.0.1); the group works as before over it."""
    env = single_worker(monkeypatch)
    monkeypatch.setenv("DDPJOB_LISTEN_HOST", "127.0.0.1")
    with distributed(env, timeout=datetime.timedelta(seconds=30)):
        found = [(s.address, s.port) for s in listeners({os.getpid()}) if s.port == env.master_port]
        tensor = torch.ones(1)
        torch_dist.all_reduce(tensor)
    assert found == [("127.0.0.1", env.master_port)], found
    assert tensor.item() == 1.0


def test_without_a_listen_host_the_group_store_is_torchs_env_rendezvous():
    """Pods set no DDPJOB_LISTEN_HOST: nothing changes there."""
    env = DistEnv(rank=0, world_size=1, local_rank=0, local_world_size=1, group_rank=0, restart_count=0,
                  run_id="test", master_addr="127.0.0.1", master_port=1)
    assert group_store(env, datetime.timedelta(seconds=1), environ={}) is None
