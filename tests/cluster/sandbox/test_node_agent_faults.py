"""Faults around the sandbox kubelets on the real control plane (trivial pods, no torch, no
operator): a pod the real scheduler cannot place until capacity arrives, a condition another
controller sets on a pod, and a Node whose kubelet died."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from ddpjob_sandbox.client import KubeClient
from ddpjob_sandbox.control_plane.kubelets import Containers, joining_kubelet
from ddpjob_sandbox.scripted import set_disruption_target
from tests.cluster.conftest import HEARTBEAT_SECONDS
from tests.cluster.test_kubelet import WAIT, phase_in, pod
from tests.cluster.sandbox_only import KUBELETS

pytestmark = [pytest.mark.cluster, pytest.mark.sandbox_only(KUBELETS)]

SLEEPER = "import time; time.sleep(60)"
GPU = "nvidia.com/gpu"


def test_a_pod_no_node_fits_stays_pending_with_the_schedulers_words_until_capacity_arrives(
        control_plane, kube: KubeClient, tmp_path: Path):
    body = pod("held", "print('ran')")
    body["spec"]["containers"][0]["resources"] = {"limits": {GPU: "1"}}
    kube.create("pods", body)
    scheduled = kube.wait_for(
        lambda: next((c for c in (kube.get("pods", "held").get("status") or {}).get("conditions") or []
                      if c["type"] == "PodScheduled"), None), timeout=WAIT, what="the scheduler's PodScheduled")
    assert (scheduled["status"], scheduled["reason"]) == ("False", "Unschedulable"), scheduled
    # The real scheduler's words (decide/capacity.py repeats them in the job's condition): the
    # Nodes that exist, each short of the resource.
    assert f"Insufficient {GPU}" in scheduled["message"] and "nodes are available" in scheduled["message"], scheduled
    assert kube.get("pods", "held")["status"]["phase"] == "Pending"
    # Capacity arrives: a Node with a GPU joins, and the scheduler places the pod there.
    name = f"gpu-{kube.namespace}"
    with joining_kubelet(kube, control_plane.layout.pki, control_plane.url, name, tmp_path, capacity={GPU: "1"},
                         heartbeat_seconds=HEARTBEAT_SECONDS, poll_seconds=0.2):
        done = phase_in(kube, "held", ("Succeeded",))
        assert done["spec"]["nodeName"] == name
        assert {c["type"]: c["status"] for c in done["status"]["conditions"]}["PodScheduled"] == "True"


def test_a_disruption_target_survives_the_kubelets_status_writes(containers: Containers, kube: KubeClient):
    kube.create("pods", pod("victim", SLEEPER, grace=1))
    phase_in(kube, "victim", ("Running",))
    set_disruption_target(kube, "victim", exit_code=None)
    containers.kill("victim")  # stopped, and not deleted: the final status stays readable
    last = phase_in(kube, "victim", ("Failed",))
    assert "DisruptionTarget" in [c["type"] for c in last["status"]["conditions"]], last["status"]


def test_a_dead_kubelet_leaves_its_deleted_pod_terminating_until_a_force_delete(control_plane, kube: KubeClient,
                                                                                tmp_path: Path):
    name = f"doomed-{kube.namespace}"
    with joining_kubelet(kube, control_plane.layout.pki, control_plane.url, name, tmp_path,
                         heartbeat_seconds=HEARTBEAT_SECONDS, poll_seconds=0.2) as kubelet:
        kube.create("pods", pod("doomed", SLEEPER, grace=1, node=name))
        phase_in(kube, "doomed", ("Running",))
        container = Containers([kubelet], kube).wait_for_container("doomed", WAIT)
        kubelet.stop()  # the machine dies: its processes gone, its kubelet silent
        assert not container.pids()
        kube.delete("pods", "doomed", gracePeriodSeconds=1)
        time.sleep(2.5)  # past its deadline: a live kubelet would have confirmed by now
        stuck = kube.find("pods", "doomed")
        assert stuck["metadata"]["deletionTimestamp"] and stuck["status"]["phase"] == "Running", stuck
        kube.delete("pods", "doomed", gracePeriodSeconds=0)
        assert kube.find("pods", "doomed") is None
