"""The operator installed with the real `helm install` of charts/ddpjob-operator, running as its
Deployment's pod on a sandbox kubelet under the chart's ServiceAccount and RBAC (never as admin),
trains the shipped c10d example to Succeeded on the real control plane; a node pod deleted
mid-run is replaced and the job still succeeds."""
from __future__ import annotations

import pytest

from ddpjob_operator.api import constants as C
from ddpjob_operator.render.common import job_selector
from ddpjob_sandbox.control_plane import ControlPlane
from tests.cluster.installed_operator import (
    JOB_SECONDS, LONGER, OPERATOR_READY_SECONDS, OPERATOR_SELECTOR, Installed, job_phase, pods_created_by,
    start_example, wait, wait_finished,
)

pytestmark = pytest.mark.cluster

@pytest.mark.timeout(OPERATOR_READY_SECONDS + JOB_SECONDS + 120)  # the control plane may start in this test's setup
def test_helm_installs_the_operator_as_a_pod_that_trains_the_c10d_example_to_succeeded(
        installed: Installed, control_plane: ControlPlane):
    kube = installed.kube
    (operator_pod,) = kube.list("pods", label_selector=OPERATOR_SELECTOR)
    assert operator_pod["status"]["phase"] == "Running" and operator_pod["spec"]["nodeName"]
    start_example(installed, "mlp")
    status = wait_finished(installed, "mlp")
    assert status["phase"] == C.PHASE_SUCCEEDED, status
    assert pods_created_by(control_plane, kube.namespace, "mlp-") == {installed.account}, \
        "the operator created the job's pods under the chart's ServiceAccount, not as the admin"
    kube.delete("ddpjobs", "mlp")
    wait(installed, lambda: not kube.list("pods", label_selector=job_selector("mlp")), 60,
         "the job's pods gone with it")


@pytest.mark.slow  # a second training with a replacement (~2-3 min on a loaded 2-core machine)
@pytest.mark.timeout(OPERATOR_READY_SECONDS + 2 * JOB_SECONDS)
def test_a_node_pod_deleted_mid_run_is_replaced_and_the_job_succeeds(installed: Installed):
    kube = installed.kube
    start_example(installed, "mlp-again", LONGER)
    # The operator reads the snapshot from the pods' progress port (their own addresses) while they run.
    wait(installed, lambda: ((kube.get("ddpjobs", "mlp-again").get("status") or {}).get("lastSnapshot") or {})
         .get("step"), JOB_SECONDS, "a first snapshot")
    assert job_phase(kube, "mlp-again") == C.PHASE_RUNNING, "deleted mid-run, not after the end"
    victim = kube.get("pods", "mlp-again-node-1")
    kube.delete("pods", "mlp-again-node-1")
    wait(installed, lambda: (p := kube.find("pods", "mlp-again-node-1")) is not None
         and p["metadata"]["uid"] != victim["metadata"]["uid"], JOB_SECONDS, "the operator replacing the deleted pod")
    status = wait_finished(installed, "mlp-again")
    assert status["phase"] == C.PHASE_SUCCEEDED, status
    recorded = [f for f in status.get("failures") or [] if f["pod"] == "mlp-again-node-1"]
    # Recorded as a deletion (a free restart); the replacement may fail later when it joins as the
    # others finish (seen once in three runs), which the operator tolerates: the job Succeeded.
    assert recorded and recorded[0]["cause"] == C.CAUSE_DELETED, status.get("failures")
