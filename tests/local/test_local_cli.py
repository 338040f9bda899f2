"""`ddpjob run` refuses bad input with one message and a non-zero exit, before any process starts."""
import socket
import subprocess
import sys

import pytest

from ddpjob_operator import cli
from ddpjob_sandbox.examples import C10D_EXAMPLE, load_example, write_manifest

EXAMPLE = C10D_EXAMPLE


def example(tmp_path, **spec_changes):
    job = load_example()
    job["spec"].update(spec_changes)
    return str(write_manifest(job, tmp_path / "job.yaml"))


def run_cli(capsys, tmp_path, *argv):
    workdir = tmp_path / "run"
    code = cli.main(["run", *argv, "--workdir", str(workdir)])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out
    assert not workdir.exists(), "nothing may be started or written for bad input"
    return code, captured.err.strip().splitlines()


@pytest.fixture
def busy_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_a_missing_file_is_named(capsys, tmp_path):
    code, err = run_cli(capsys, tmp_path, "/no/such/job.yaml")
    assert code == cli.EXIT_BAD_INPUT
    assert err == ["ddpjob: cannot read /no/such/job.yaml: No such file or directory"]


def test_invalid_yaml_is_one_message(capsys, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("spec: [unclosed")
    code, err = run_cli(capsys, tmp_path, str(path))
    assert code == cli.EXIT_BAD_INPUT and len(err) == 1 and "is not valid YAML" in err[0]


def test_an_invalid_spec_names_the_field_value_and_rule(capsys, tmp_path):
    code, err = run_cli(capsys, tmp_path, example(tmp_path, replicas=9))
    assert code == cli.EXIT_INVALID
    assert err == [f"{tmp_path / 'job.yaml'}: spec.replicas (9) must be <= spec.elasticPolicy.maxReplicas (4)"]


def test_a_busy_rendezvous_port_is_refused_with_the_fix(capsys, tmp_path, busy_port):
    spec = load_example()["spec"]
    code, err = run_cli(capsys, tmp_path, example(tmp_path, elasticPolicy={**spec["elasticPolicy"], "rdzvPort": busy_port}))
    assert code == cli.EXIT_BAD_INPUT
    assert err == [f"ddpjob: spec.elasticPolicy.rdzvPort ({busy_port}) is already in use on 127.0.0.1: "
                   "stop what listens there, or pass --port N (--port 0 picks a free one)"]


def test_a_busy_port_given_with_port_names_the_option(capsys, tmp_path, busy_port):
    code, err = run_cli(capsys, tmp_path, str(EXAMPLE), "--port", str(busy_port))
    assert code == cli.EXIT_BAD_INPUT and err[0].startswith(f"ddpjob: --port ({busy_port}) is already in use")


def test_an_env_entry_with_value_from_cannot_run_locally(capsys, tmp_path):
    env = [{"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "key"}}}]
    code, err = run_cli(capsys, tmp_path, example(tmp_path, env=env), "--port", "0")
    assert code == cli.EXIT_BAD_INPUT
    assert err == ["ddpjob: spec.env[0] (WANDB_API_KEY) uses valueFrom, which only a cluster can resolve; "
                   "give it a literal value for local runs"]


@pytest.mark.parametrize("argv, message", [
    (["--kill-node", "2"], "ddpjob: --kill-node (2) must be a node index 0..1 (spec.replicas is 2)"),
    (["--kill-node-after", "-1"], "ddpjob: --kill-node-after (-1) must be >= 0 seconds"),
    (["--node-lost"], "ddpjob: --node-lost says what the --kill-node-after kill stands for: give --kill-node-after too"),
])
def test_kill_options_outside_the_job_are_refused(capsys, tmp_path, argv, message):
    code, err = run_cli(capsys, tmp_path, str(EXAMPLE), *argv)
    assert code == cli.EXIT_BAD_INPUT and err == [message]


def test_a_script_that_does_not_exist_here_is_named(capsys, tmp_path):
    code, err = run_cli(capsys, tmp_path, example(tmp_path, module=None, script="/workspace/train.py"))
    assert code == cli.EXIT_BAD_INPUT
    assert err[0].startswith("ddpjob: spec.script (/workspace/train.py) does not exist on this machine")


def test_a_module_whose_package_is_not_installed_is_named(capsys, tmp_path):
    code, err = run_cli(capsys, tmp_path, example(tmp_path, module="no_such_pkg.train"))
    assert code == cli.EXIT_BAD_INPUT
    assert err[0].startswith("ddpjob: spec.module (no_such_pkg.train) cannot be imported here")


def test_the_command_line_loads_without_torch():
    code = ("import sys, ddpjob_operator.cli, ddpjob_operator.local.runner, ddpjob_operator.local.command; "
            "print('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"


@pytest.mark.parametrize("changes, message", [
    ({"elasticPolicy": {"rdzvBackend": "etcd-v3", "rdzvEndpoints": ["127.0.0.1:2379"], "rdzvSecretName": "etcd-client"}},
     "ddpjob: spec.elasticPolicy.rdzvSecretName (etcd-client) names a Secret, which only a cluster can mount"),
    ({"elasticPolicy": {"rdzvBackend": "etcd-v3", "managedEtcd": {"enabled": True}}},
     "ddpjob: spec.elasticPolicy.managedEtcd.enabled (true) asks the operator to run etcd"),
    ({"runPolicy": {"suspend": True}}, "ddpjob: spec.runPolicy.suspend (true) means no node runs"),
])
def test_fields_that_need_a_cluster_are_refused_by_name(capsys, tmp_path, changes, message):
    code, err = run_cli(capsys, tmp_path, example(tmp_path, **changes), "--port", "0")
    assert code == cli.EXIT_BAD_INPUT and len(err) == 1 and err[0].startswith(message), err


def test_a_run_directory_that_cannot_be_created_is_named(capsys, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    code = cli.main(["run", str(EXAMPLE), "--port", "0", "--workdir", str(blocker / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == cli.EXIT_BAD_INPUT
    assert err == [f"ddpjob: cannot create the run directory {blocker / 'run'}: Not a directory; pass --workdir DIR"]
