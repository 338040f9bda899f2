"""The `ddpjob` command: validate and render a DDPJob file, clear errors for bad input."""
import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ddpjob_operator import cli

EXAMPLE = Path(__file__).resolve().parents[3] / "manifests" / "examples" / "ddpjob-c10d.yaml"


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
    ("spec: [unclosed", "is not valid YAML: expected ',' or ']', but got '<stream end>' (line 1, column 16)"),
    ("kind: Pod\n---\nkind: Service\n", "must hold exactly one document with kind: DDPJob (found 0)"),
    ("- a\n- b\n", "must hold a DDPJob: a mapping with apiVersion, kind, metadata and spec, not a list"),
    ("just text\n", "must hold a DDPJob: a mapping with apiVersion, kind, metadata and spec, not a string"),
    ("42\n", "must hold a DDPJob: a mapping with apiVersion, kind, metadata and spec, not a int scalar"),
    ("spec: " + "[" * 5000 + "]" * 5000, "is nested too deeply to read (a DDPJob is at most 32 levels deep)"),
    ("a: \x00", "is not valid YAML: unacceptable character #x0000: special characters are not allowed"),
])
def test_unreadable_input_gets_one_message_and_exit_2(tmp_path, capsys, text, expected):
    path = write(tmp_path, text)
    assert cli.main(["validate", path]) == cli.EXIT_BAD_INPUT
    assert capsys.readouterr().err == f"ddpjob: {path} {expected}\n"


def test_a_binary_file_is_named_as_not_text(tmp_path, capsys):
    path = tmp_path / "model.pt"
    path.write_bytes(b"PK\x03\x04\x14\x00\x00\x00\x08\x00\xff\xfe")
    assert cli.main(["validate", str(path)]) == cli.EXIT_BAD_INPUT
    assert capsys.readouterr().err == f"ddpjob: {path} is not a YAML text file: byte 10 (0xff) is not UTF-8\n"


def test_binary_input_on_stdin_exits_2_without_a_traceback():
    run = subprocess.run([sys.executable, "-m", "ddpjob_operator.cli", "validate", "-"],
                         input=b"\x89PNG\r\n\x1a\n\x00", capture_output=True, timeout=60)
    assert (run.returncode, run.stderr.decode()) == (
        cli.EXIT_BAD_INPUT, "ddpjob: - is not a YAML text file: byte 0 (0x89) is not UTF-8\n")


def test_one_document_of_another_kind_is_an_invalid_job_naming_the_kind(tmp_path, capsys):
    path = write(tmp_path, "apiVersion: v1\nkind: Pod\nmetadata: {name: mlp}\nspec: {image: i, module: m}\n")
    assert cli.main(["validate", path]) == cli.EXIT_INVALID
    assert capsys.readouterr().err.splitlines() == [
        f'{path}: apiVersion ("v1") must be ddpjob.io/v1alpha1', f'{path}: kind ("Pod") must be DDPJob']


def test_yaml_is_read_as_kubectl_sends_it_whole_floats_as_integers_and_dates_as_text(tmp_path, capsys):
    job = yaml.safe_load(EXAMPLE.read_text())
    text = yaml.safe_dump(job).replace("replicas: 2\n", "replicas: 2.0\n")
    text = text.replace("  args:\n", "  args:\n  - 2024-01-01\n")
    assert "replicas: 2.0" in text and "  - 2024-01-01" in text
    assert cli.main(["validate", write(tmp_path, text)]) == 0, capsys.readouterr().err


def test_render_reports_a_metadata_list_instead_of_crashing(tmp_path, capsys):
    job = yaml.safe_load(EXAMPLE.read_text())
    job["metadata"] = ["mlp"]
    path = write(tmp_path, yaml.safe_dump(job))
    assert cli.main(["render", path]) == cli.EXIT_INVALID
    assert capsys.readouterr().err == f'{path}: metadata (["mlp"]) must be a mapping (an object) with the job\'s name\n'


def test_a_missing_file_is_named(capsys):
    assert cli.main(["render", "/no/such/job.yaml"]) == cli.EXIT_BAD_INPUT
    assert "cannot read /no/such/job.yaml" in capsys.readouterr().err


def test_render_prints_the_service_and_one_pod_per_desired_node(tmp_path, capsys):
    path = example_with(tmp_path, replicas=3)
    assert cli.main(["render", path, "--namespace", "team-a"]) == 0
    objects = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [o["metadata"]["name"] for o in objects] == ["mlp", "mlp-rdzv", "mlp-rdzv", "mlp-node-0", "mlp-node-1",
                                                         "mlp-node-2", "mlp", "mlp"]  # the c10d store pod comes first
    assert [o["kind"] for o in objects] == ["Service", "Service", "Pod", "Pod", "Pod", "Pod", "NetworkPolicy",
                                            "PodDisruptionBudget"]
    assert objects[-1]["spec"]["minAvailable"] == 1 + 1, "min(minReplicas 1, replicas 3 - 1) nodes + the store pod"
    assert all(o["metadata"]["namespace"] == "team-a" for o in objects)
    env = {e["name"]: e.get("value") for e in objects[3]["spec"]["containers"][0]["env"]}
    assert env["PET_RDZV_ID"] == cli.DRY_RUN_UID
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"


def test_render_leaves_out_the_policy_and_the_budget_a_job_turns_off(tmp_path, capsys):
    path = example_with(tmp_path, networkPolicy={"enabled": False}, runPolicy={"podDisruptionBudget": False})
    assert cli.main(["render", path]) == 0
    kinds = [o["kind"] for o in yaml.safe_load_all(capsys.readouterr().out)]
    assert "NetworkPolicy" not in kinds and "PodDisruptionBudget" not in kinds


def test_render_refuses_an_invalid_job(tmp_path, capsys):
    assert cli.main(["render", example_with(tmp_path, replicas=0)]) == cli.EXIT_INVALID
    assert "spec.replicas (0)" in capsys.readouterr().err


def test_validate_reports_field_and_cross_field_errors_in_one_run(tmp_path, capsys):
    path = example_with(tmp_path, replicas=9, imagePullPolicy="Sometimes", script="/w/train.py",
                        elasticPolicy={"minReplicas": 1, "maxReplicas": 4, "maxRestarts": -1},
                        failurePolicy={"backoffSeconds": 10, "maxBackoffSeconds": 1})
    assert cli.main(["validate", path]) == cli.EXIT_INVALID
    assert capsys.readouterr().err.splitlines() == [f"{path}: {line}" for line in (
        "spec.imagePullPolicy (\"Sometimes\") must be one of 'Always', 'IfNotPresent' or 'Never'",
        "spec.elasticPolicy.maxRestarts (-1) must be >= 0",
        'spec.script ("/w/train.py") may not be set together with spec.module ("ddpjob_trainer.examples.mlp"): '
        "set exactly one of them",
        "spec.replicas (9) must be <= spec.elasticPolicy.maxReplicas (4)",
        "spec.failurePolicy.maxBackoffSeconds (1) must be >= spec.failurePolicy.backoffSeconds (10)",
    )]


def test_validate_suggests_the_field_a_misspelt_one_was_meant_to_be(tmp_path, capsys):
    job = yaml.safe_load(EXAMPLE.read_text())
    job["spec"]["elasticPolicy"]["minReplica"] = job["spec"]["elasticPolicy"].pop("minReplicas")
    path = write(tmp_path, yaml.safe_dump(job))
    assert cli.main(["validate", path]) == cli.EXIT_INVALID
    assert capsys.readouterr().err == (
        f"{path}: spec.elasticPolicy.minReplica (1) is not a field of this object: did you mean 'minReplicas'?\n")


@pytest.mark.parametrize("argv", [["--version"], ["validate", "--version"]])
def test_version_prints_the_installed_package_version(argv, capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"ddpjob {importlib.metadata.version('ddpjob-operator')}\n"


@pytest.mark.parametrize("argv", [["--help"], ["validate", "--help"], ["render", "--help"], ["run", "--help"]])
def test_help_is_plain_text_without_docstring_markup(argv, capsys):
    with pytest.raises(SystemExit):
        cli.main(argv)
    text = capsys.readouterr().out
    assert text.startswith("usage: ddpjob")
    assert "``" not in text and ":func:" not in text and not re.search(r":\w+:`", text)


def test_validate_applies_the_operators_replica_cap_by_default(tmp_path, capsys):
    path = example_with(tmp_path, replicas=600, elasticPolicy={"maxReplicas": 700})
    assert cli.main(["validate", path]) == cli.EXIT_INVALID
    assert capsys.readouterr().err.splitlines() == [
        f"{path}: spec.replicas (600) must be <= 500, the operator's --max-replicas setting",
        f"{path}: spec.elasticPolicy.maxReplicas (700) must be <= 500, the operator's --max-replicas setting"]


def test_validate_max_replicas_sets_the_cap_the_operator_runs_with(tmp_path, capsys):
    path = example_with(tmp_path)  # elasticPolicy.maxReplicas: 4
    assert cli.main(["validate", path, "--max-replicas", "3"]) == cli.EXIT_INVALID
    assert capsys.readouterr().err == (
        f"{path}: spec.elasticPolicy.maxReplicas (4) must be <= 3, the operator's --max-replicas setting\n")
    assert cli.main(["validate", path, "--max-replicas", "4"]) == 0


def test_validate_refuses_a_max_replicas_the_operator_would_refuse(tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["validate", str(EXAMPLE), "--max-replicas", "1001"])
    assert exited.value.code == 2
    assert "argument --max-replicas: (1001) must be 1..1000, the CRD's own maximum" in capsys.readouterr().err


def test_validate_reports_both_the_crd_maximum_and_the_cap_once_each(tmp_path, capsys):
    path = example_with(tmp_path, replicas=2000, elasticPolicy={"maxReplicas": 600})
    assert cli.main(["validate", path]) == cli.EXIT_INVALID
    assert capsys.readouterr().err.splitlines() == [
        f"{path}: spec.replicas (2000) must be <= 1000",
        f"{path}: spec.elasticPolicy.maxReplicas (600) must be <= 500, the operator's --max-replicas setting"]
