"""The `ddpjob` command: validate and render a DDPJob file, clear errors for bad input."""
from pathlib import Path

import pytest
import yaml

from ddpjob_operator import cli

EXAMPLE = Path(__file__).resolve().parents[2] / "manifests" / "examples" / "ddpjob-c10d.yaml"


def write(tmp_path, text, name="job.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def example_with(tmp_path, **spec_changes):
    job = yaml.safe_load(EXAMPLE.read_text())
    job["spec"].update(spec_changes)
    return write(tmp_path, yaml.safe_dump(job))


def test_validate_accepts_the_c10d_example(capsys):
    assert cli.main(["validate", str(EXAMPLE)]) == 0
    assert "valid" in capsys.readouterr().out


def test_validate_reports_every_invalid_field_with_path_value_and_rule(tmp_path, capsys):
    path = example_with(tmp_path, replicas=0, imagePullPolicy="Sometimes")
    assert cli.main(["validate", path]) == cli.EXIT_INVALID
    err = capsys.readouterr().err
    assert "spec.replicas (0)" in err
    assert "spec.imagePullPolicy" in err and "Sometimes" in err


@pytest.mark.parametrize("text, expected", [
    ("spec: [unclosed", "is not valid YAML"),
    ("kind: Pod\n", "exactly one document with kind: DDPJob (found 0)"),
])
def test_unreadable_input_gets_one_message_and_exit_2(tmp_path, capsys, text, expected):
    assert cli.main(["validate", write(tmp_path, text)]) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err


def test_a_missing_file_is_named(capsys):
    assert cli.main(["render", "/no/such/job.yaml"]) == cli.EXIT_BAD_INPUT
    assert "cannot read /no/such/job.yaml" in capsys.readouterr().err


def test_render_prints_the_service_and_one_pod_per_desired_node(tmp_path, capsys):
    path = example_with(tmp_path, replicas=3)
    assert cli.main(["render", path, "--namespace", "team-a"]) == 0
    objects = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [o["metadata"]["name"] for o in objects] == ["mlp", "mlp-rdzv", "mlp-rdzv", "mlp-node-0", "mlp-node-1",
                                                         "mlp-node-2"]  # the c10d store pod comes first
    assert [o["kind"] for o in objects] == ["Service", "Service", "Pod", "Pod", "Pod", "Pod"]
    assert all(o["metadata"]["namespace"] == "team-a" for o in objects)
    env = {e["name"]: e.get("value") for e in objects[3]["spec"]["containers"][0]["env"]}
    assert env["PET_RDZV_ID"] == cli.DRY_RUN_UID
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"


def test_render_refuses_an_invalid_job(tmp_path, capsys):
    assert cli.main(["render", example_with(tmp_path, replicas=0)]) == cli.EXIT_INVALID
    assert "spec.replicas (0)" in capsys.readouterr().err
