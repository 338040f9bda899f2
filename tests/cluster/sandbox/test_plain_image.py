"""A plain PyTorch image runs a c10d job on the default topology: no ddpjob package in it.

The kubelets map the job's image to an environment with torch and every other package of
this one except ddpjob's (ddpjob_sandbox.images.torch_only_env: ``import ddpjob_trainer``
fails there, torchrun knows none of ddpjob's rendezvous backends). The helm-installed
operator renders the store pod (``python -c`` with ddpjob_rdzv/store_program.py's text) and two node pods
(torchrun running tests/byo_scripts/tutorial_multinode.py, a script with no ddpjob import);
both run in that environment, and the job trains to Succeeded through the store pod.

What needs ddpjob-trainer in the image is off here, as it is by default (fastRestart); the
progress the trainer would serve is missing, which the status shows as no lastSnapshot, with no
Warning about it. Turned on in such an image, fastRestart fails the job at once, saying what is
missing and how to fix it (decide.failure.trainer_missing).
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ddpjob_operator.api import constants as C
from ddpjob_sandbox.control_plane.kubelets import Containers
from ddpjob_sandbox.readers import events
from tests.cluster.sandbox.scenarios import TEST_SECONDS, Sandbox

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(TEST_SECONDS)]

SCRIPT = Path(__file__).resolve().parents[2] / "byo_scripts" / "tutorial_multinode.py"
PLAIN_IMAGE = "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime"  # torch and Python, no ddpjob
START_TIMEOUT = 150  # store + 2 agents + 2 workers importing torch on 2 shared cores
EPOCHS = 4


@pytest.fixture
def plain_image(sandbox: Sandbox, torch_only_env: Path) -> Iterator[Containers]:
    """Every kubelet runs PLAIN_IMAGE in the torch-only environment for this test."""
    agents = [k.agent for k in sandbox.nodes.kubelets]
    for agent in agents:
        agent.images[PLAIN_IMAGE] = torch_only_env
    try:
        yield sandbox.nodes
    finally:
        for agent in agents:
            agent.images.pop(PLAIN_IMAGE, None)


def plain_script_job(sandbox: Sandbox) -> dict:
    """The c10d example as a user of a plain image writes it: their image and script, and no
    fastRestart (it needs ddpjob-trainer in the image; off by default)."""
    body = sandbox.body([str(EPOCHS), "1"], rdzv_store=None)
    spec = body["spec"]
    del spec["module"], spec["elasticPolicy"]["fastRestart"], spec["elasticPolicy"]["rdzvStore"]
    spec.update(image=PLAIN_IMAGE, script=str(SCRIPT), env=[{"name": "TUTORIAL_STEP_SLEEP", "value": "0.05"}])
    return body


def test_a_plain_torch_image_runs_a_plain_script_to_success_through_the_store_pod(
        sandbox: Sandbox, plain_image: Containers, torch_only_env: Path):
    k8s, nodes, job = sandbox.kube, plain_image, sandbox.job
    body = plain_script_job(sandbox)
    port = body["spec"]["elasticPolicy"]["rdzvPort"]
    sandbox.apply(body)

    store = nodes.wait_for_container(f"{job}-rdzv", START_TIMEOUT)
    k8s.wait_for(lambda: nodes.pod_listening_on(port) == f"{job}-rdzv", timeout=START_TIMEOUT,
                 what="the store pod listening on the rendezvous port")
    k8s.wait_for(lambda: k8s.get("ddpjobs", job).get("status", {}).get("phase") == C.PHASE_SUCCEEDED,
                 timeout=START_TIMEOUT + 120, what="the job Succeeded")
    node_pods = [nodes.current(f"{job}-node-{i}") for i in range(2)]
    image_bin = torch_only_env / "bin"
    # Every container ran the image's own Python, without this machine's PYTHONPATH.
    assert store.process.args[:2] == [str(image_bin / "python"), "-c"], store.process.args[:2]
    assert [n.process.args[:2] for n in node_pods] == [[str(image_bin / "torchrun"), str(SCRIPT)]] * 2
    assert all(n.exit_code == 0 and f"Epoch {EPOCHS - 1}" in n.log(200_000) for n in node_pods), nodes.logs()
    assert "ddpjob rendezvous store listening on 0.0.0.0" in store.log()
    status = k8s.get("ddpjobs", job)["status"]
    assert status.get("restarts", 0) == 0 and "lastSnapshot" not in status, status
    # Each pod serves progress on its own address (on a shared 127.0.0.1:29410 a trainer of another
    # test could answer the poll): no Warning at all.
    warnings = [(reason, message) for kind, reason, message in events(k8s, job) if kind == C.EVENT_WARNING]
    assert warnings == [], warnings


def test_fast_restart_in_a_plain_image_fails_the_job_at_once_naming_what_is_missing(
        sandbox: Sandbox, plain_image: Containers):
    """fastRestart runs torchrun with ddpjob-trainer's ddpjob-c10d backend, which a plain image lacks:
    the job fails on the first node failure with the fix, not after spending its restart budget."""
    k8s, job = sandbox.kube, sandbox.job
    body = plain_script_job(sandbox)
    body["spec"]["elasticPolicy"]["fastRestart"] = True
    sandbox.apply(body)
    status = k8s.wait_for(lambda: (s := k8s.get("ddpjobs", job).get("status", {})).get("phase") == C.PHASE_FAILED
                          and s, timeout=START_TIMEOUT, what="the job Failed")
    failed = next(c for c in status["conditions"] if c["type"] == C.COND_FAILED)
    assert failed["reason"] == C.REASON_TRAINER_NOT_IN_IMAGE
    assert "rendezvous backend 'ddpjob-c10d' is not registered" in failed["message"]
    assert "install it in the image (pip install ddpjob-trainer)" in failed["message"]
    assert status.get("restarts", 0) == 0 and status["failures"][0]["cause"] == C.CAUSE_TRAINER_NOT_IN_IMAGE
