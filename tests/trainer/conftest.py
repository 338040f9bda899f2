"""Fixtures shared by the trainer tests."""
import os

import pytest

from ddpjob_trainer import distributed
from ddpjob_trainer.env import DistEnv
from ddpjob_sandbox.procs import free_port


@pytest.fixture(scope="module")
def env():
    """A one-process gloo group on a free loopback port (restart 0), torn down after the module."""
    port = free_port()
    saved = {name: os.environ.get(name) for name in ("MASTER_ADDR", "MASTER_PORT")}
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    single = DistEnv(rank=0, world_size=1, local_rank=0, local_world_size=1, group_rank=0,
                     restart_count=0, run_id="test", master_addr="127.0.0.1", master_port=port)
    try:
        with distributed(single):
            yield single
    finally:
        for name, value in saved.items():
            os.environ.pop(name, None) if value is None else os.environ.__setitem__(name, value)


@pytest.fixture(autouse=True, scope="session")
def fast_tier_in_a_temporary_root(tmp_path_factory):
    """The fast snapshot tier is on by default: its copies go under a temporary root (inherited by
    the torchrun workers the tests start), not into the machine's /dev/shm, where every test that
    ends in a crash would leave two copies of its state behind."""
    saved = os.environ.get("DDPJOB_FAST_SNAPSHOT_ROOT")
    os.environ["DDPJOB_FAST_SNAPSHOT_ROOT"] = str(tmp_path_factory.mktemp("fast-tier"))
    yield
    if saved is None:
        os.environ.pop("DDPJOB_FAST_SNAPSHOT_ROOT", None)
    else:
        os.environ["DDPJOB_FAST_SNAPSHOT_ROOT"] = saved
