"""The sandbox node agent's opt-in fault tools on their own (trivial pods, no torch, no
operator): a pod held unschedulable, a node that dies, and conditions others set on a pod."""
from __future__ import annotations

import time

import pytest

from ddpjob_sandbox.scripted import set_disruption_target
from ddpjob_sandbox.pod_status import INSUFFICIENT_GPU, keep_foreign_conditions
from ddpjob_sandbox.node import running_node_agent
from tests.sandbox.test_node_agent import make_pod, wait_phase

SLEEPER = "import time; time.sleep(60)"


def test_keep_foreign_conditions_keeps_a_disruption_target_and_replaces_the_kubelets_own():
    disruption = {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
    pod = {"status": {"conditions": [{"type": "Ready", "status": "True"}, disruption]}}
    body = {"status": {"phase": "Failed", "conditions": [{"type": "Ready", "status": "False"}]}}
    assert keep_foreign_conditions(body, pod)["status"]["conditions"] == [
        {"type": "Ready", "status": "False"}, disruption]
    assert keep_foreign_conditions({"status": {"phase": "Running"}}, pod) == {"status": {"phase": "Running"}}


def test_a_held_pod_stays_pending_with_the_schedulers_words_until_released(k8s, node_agent):
    node_agent.hold_unscheduled("held")
    k8s.create("pods", make_pod("held", "print('ran')"))
    pod = k8s.wait_for(lambda: (p := k8s.find("pods", "held")) and (p.get("status") or {}).get("conditions") and p,
                       what="the PodScheduled condition")
    scheduled = pod["status"]["conditions"][0]
    assert pod["status"]["phase"] == "Pending"
    assert (scheduled["type"], scheduled["status"], scheduled["reason"], scheduled["message"]) == (
        "PodScheduled", "False", "Unschedulable", INSUFFICIENT_GPU)
    time.sleep(0.5)
    assert node_agent.current("held") is None
    node_agent.release("held")
    pod = wait_phase(k8s, "held", ("Succeeded",))
    assert {c["type"]: c["status"] for c in pod["status"]["conditions"]}["PodScheduled"] == "True"


def test_a_disruption_target_survives_the_kubelets_status_writes(k8s, node_agent):
    k8s.create("pods", make_pod("victim", SLEEPER, grace=1))
    wait_phase(k8s, "victim", ("Running",))
    set_disruption_target(k8s, "victim", exit_code=None)
    node_agent.kill("victim")  # stopped, and not deleted: the final status stays readable
    last = k8s.wait_for(lambda: (p := k8s.find("pods", "victim")) and p["status"]["phase"] == "Failed" and p,
                        timeout=20, what="the stopped pod's status")
    assert "DisruptionTarget" in [c["type"] for c in last["status"]["conditions"]], last["status"]


def test_a_dead_node_leaves_its_deleted_pod_terminating_until_a_force_delete(cluster, k8s, tmp_path):
    cluster.emulator.graceful_pod_deletion = True
    with running_node_agent(k8s, tmp_path / "node", bind_nodes=True) as agent:
        k8s.create("pods", make_pod("doomed", SLEEPER, grace=1))
        wait_phase(k8s, "doomed", ("Running",))
        node = agent.node_of("doomed")
        assert node.startswith("doomed-") and k8s.get("nodes", node)["status"]["conditions"][0]["status"] == "True"
        lost = agent.node_down("doomed")
        assert k8s.get("nodes", node)["status"]["conditions"][0]["status"] == "False"
        k8s.wait_for(lambda: not lost.pids(), timeout=10, what="the node's processes gone")
        k8s.delete("pods", "doomed", gracePeriodSeconds=1)
        time.sleep(2.5)  # past its deadline: a live kubelet would have confirmed by now
        stuck = k8s.find("pods", "doomed")
        assert stuck["metadata"]["deletionTimestamp"] and stuck["status"]["phase"] == "Running"
        k8s.delete("pods", "doomed", gracePeriodSeconds=0)
        assert k8s.find("pods", "doomed") is None


def test_node_down_needs_bind_nodes(k8s, node_agent):
    k8s.create("pods", make_pod("plain", SLEEPER, grace=1))
    wait_phase(k8s, "plain", ("Running",))
    with pytest.raises(AssertionError, match="bind_nodes=True"):
        node_agent.node_down("plain")
    assert not k8s.get("pods", "plain")["spec"].get("nodeName")
