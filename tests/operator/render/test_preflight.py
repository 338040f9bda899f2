"""The optional pre-flight check: the rendered init container, and its script run for real."""
from __future__ import annotations

import os
import re
import subprocess
import sys

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.validation import parse_spec
from ddpjob_operator.render.node_pod import render_pod
from ddpjob_operator.render.preflight import SCRIPT
from ddpjob_sandbox.jobs import make_ddpjob
from tests.operator.builders import job_ref


def pod_spec(**fields) -> dict:
    job = make_ddpjob(replicas=2, **fields)
    return render_pod(job_ref(job), parse_spec(job["spec"]), 1)["spec"]


def test_an_enabled_check_runs_first_with_the_trainers_image_mounts_security_and_resources():
    spec = pod_spec(preflight={"enabled": True}, snapshot={"mountPath": "/ckpt"},
                    resources={"limits": {"nvidia.com/gpu": 2, "memory": "8Gi"}})
    [check], trainer = spec["initContainers"], spec["containers"][0]
    assert check["name"] == "preflight" and check["image"] == trainer["image"]
    assert check["command"][:2] == ["python", "-c"] and check["command"][3:] == ["/ckpt", "2"]
    assert check["volumeMounts"] == trainer["volumeMounts"]
    assert check["securityContext"] == trainer["securityContext"]
    assert check["resources"] == trainer["resources"]  # the device plugin gives an init container only what it asks


def test_without_it_a_pod_has_no_init_container():
    assert "initContainers" not in pod_spec()
    assert pod_spec(preflight={"enabled": True})["initContainers"][0]["command"][3:] == ["", "0"]


def run_check(snapshots: str, gpus: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SCRIPT, snapshots, str(gpus)], capture_output=True, text=True,
                          timeout=30)


def test_the_check_passes_on_a_writable_volume_and_leaves_nothing_behind(tmp_path):
    result = run_check(str(tmp_path), 0)
    assert (result.returncode, result.stderr, list(tmp_path.iterdir())) == (0, "", [])


def test_the_check_fails_fast_naming_each_problem(tmp_path):
    here = len([d for d in os.listdir("/dev") if re.fullmatch(r"nvidia[0-9]+", d)])
    result = run_check(str(tmp_path / "missing"), here + 1)
    assert result.returncode == C.PREFLIGHT_EXIT_CODE
    assert result.stderr == (
        f"preflight failed: snapshot volume {tmp_path / 'missing'} is not writable ([Errno 2] No such file or "
        f"directory: '{tmp_path / 'missing'}/.preflight-{os.uname().nodename}'); {here} GPU(s) visible as "
        f"/dev/nvidiaN, {here + 1} expected (resources.limits nvidia.com/gpu)\n")
