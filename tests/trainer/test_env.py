"""DistEnv is read from torchrun's variables; outside torchrun the error says how to start."""
import sys

import pytest

from ddpjob_trainer.env import DistEnv, TorchrunEnvError, dist_env

TORCHRUN_ENV = {
    "RANK": "3",
    "WORLD_SIZE": "4",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "1",
    "TORCHELASTIC_RESTART_COUNT": "2",
    "TORCHELASTIC_RUN_ID": "job-uid",
    "MASTER_ADDR": "mlp-node-0.mlp.default.svc.cluster.local",
    "MASTER_PORT": "29500",
}


def env_with(**changes):
    environ = dict(TORCHRUN_ENV)
    for name, value in changes.items():
        if value is None:
            environ.pop(name)
        else:
            environ[name] = value
    return environ


def test_reads_every_torchrun_variable_into_a_frozen_dataclass():
    env = dist_env(TORCHRUN_ENV)
    assert env == DistEnv(
        rank=3, world_size=4, local_rank=1, local_world_size=2, group_rank=1, restart_count=2,
        run_id="job-uid", master_addr="mlp-node-0.mlp.default.svc.cluster.local", master_port=29500,
    )
    assert not env.is_rank0
    with pytest.raises(AttributeError):
        env.rank = 0


def test_elastic_only_variables_default_to_a_first_attempt_on_one_node():
    env = dist_env(env_with(GROUP_RANK=None, TORCHELASTIC_RESTART_COUNT=None, TORCHELASTIC_RUN_ID=None, RANK="0"))
    assert (env.group_rank, env.restart_count, env.run_id, env.is_rank0) == (0, 0, "none", True)


def test_reads_the_process_environment_fresh_on_every_call(monkeypatch):
    for name, value in TORCHRUN_ENV.items():
        monkeypatch.setenv(name, value)
    assert dist_env().world_size == 4
    # After an elastic restart torchrun hands out new values; nothing is cached.
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert (dist_env().rank, dist_env().world_size) == (1, 2)


@pytest.mark.parametrize("missing", ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"])
def test_a_missing_variable_is_named_with_the_torchrun_command_to_use(missing):
    with pytest.raises(TorchrunEnvError) as error:
        dist_env(env_with(**{missing: None}), program="-m ddpjob_trainer.examples.mlp --epochs 2")
    assert str(error.value) == (
        f"environment variable {missing} is not set: start this program with torchrun, for example\n"
        "  torchrun --standalone --nproc_per_node=2 -m ddpjob_trainer.examples.mlp --epochs 2\n"
        "(torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT for every worker)"
    )


def test_the_suggested_command_names_the_running_script_when_not_given(monkeypatch):
    # As if started with `python train.py --epochs 3` (no -m module spec).
    monkeypatch.setattr(sys.modules["__main__"], "__spec__", None)
    monkeypatch.setattr("sys.argv", ["train.py", "--epochs", "3"])
    with pytest.raises(TorchrunEnvError, match=r"torchrun --standalone --nproc_per_node=2 train.py --epochs 3\n"):
        dist_env({})


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"RANK": "two"}, "environment variable RANK='two' must be an integer (torchrun sets it)"),
        ({"MASTER_PORT": ""}, "environment variable MASTER_PORT='' must be an integer (torchrun sets it)"),
        ({"WORLD_SIZE": "0", "RANK": "0"}, "environment variable WORLD_SIZE=0 must be >= 1"),
        ({"RANK": "4"}, "environment variable RANK=4 must be in [0, WORLD_SIZE=4)"),
        ({"LOCAL_RANK": "2"}, "environment variable LOCAL_RANK=2 must be in [0, LOCAL_WORLD_SIZE=2)"),
    ],
)
def test_inconsistent_values_are_rejected_with_the_variable_value_and_rule(changes, message):
    with pytest.raises(TorchrunEnvError) as error:
        dist_env(env_with(**changes))
    assert str(error.value) == message


def test_the_suggested_command_uses_dash_m_for_a_module(monkeypatch):
    class Spec:
        name = "ddpjob_trainer.examples.mlp"

    monkeypatch.setattr(sys.modules["__main__"], "__spec__", Spec())
    monkeypatch.setattr("sys.argv", ["/x/mlp.py", "--epochs", "1"])
    with pytest.raises(TorchrunEnvError, match=r"torchrun --standalone --nproc_per_node=2 -m ddpjob_trainer.examples.mlp --epochs 1\n"):
        dist_env({})
