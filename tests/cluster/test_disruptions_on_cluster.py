"""A drain on the real control plane: evictions through the Eviction API (what `kubectl drain`
and node upgrades use) against the job's PodDisruptionBudget, whose status the real disruption
controller computes. The real API server allows the eviction the budget permits and refuses
(429) the one it forbids; the helm-installed operator records the evicted pod as a disruption
(cause Disrupted, no restart charged), replaces it, and the job still succeeds; `kubectl
describe ddpjob` shows that history as the job's Events, served by the real API server."""
from __future__ import annotations

import pytest

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.names import disruption_budget_name
from ddpjob_sandbox.client import ApiError, KubeClient
from ddpjob_sandbox.control_plane.kubelets import make_kubelet
from tests.cluster.conftest import HEARTBEAT_SECONDS
from tests.cluster.installed_operator import (
    JOB_SECONDS, LONGER, OPERATOR_READY_SECONDS, Installed, diagnosis, example_body, job_phase, start_example, submit,
    wait, wait_finished,
)

pytestmark = pytest.mark.cluster

JOB = "drained"
# The pods the budget selects while the job runs whole: 2 node pods and the c10d store pod.
BUDGETED = (f"{JOB}-node-0", f"{JOB}-node-1", f"{JOB}-rdzv")


def evict(kube: KubeClient, pod: str) -> dict:
    """POST pods/<pod>/eviction, as `kubectl drain` does for each pod of a node."""
    return kube.request("POST", kube.path("pods", pod, subresource="eviction"), {
        "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": kube.namespace}})


def budget_status(kube: KubeClient) -> dict:
    """The budget's status, once the disruption controller has computed it for the current spec
    (only that controller writes status; observedGeneration says which spec it read)."""
    budget = kube.get("poddisruptionbudgets", disruption_budget_name(JOB))
    status = budget.get("status") or {}
    return status if status.get("observedGeneration") == budget["metadata"]["generation"] else {}


def ready(kube: KubeClient, name: str) -> bool:
    pod = kube.find("pods", name)
    return bool(pod) and not pod["metadata"].get("deletionTimestamp") and any(
        c["type"] == "Ready" and c["status"] == "True" for c in (pod.get("status") or {}).get("conditions") or [])


@pytest.mark.slow  # a training with an eviction and a replacement (~3 min on a loaded 2-core machine)
@pytest.mark.timeout(OPERATOR_READY_SECONDS + 2 * JOB_SECONDS + 120)  # the control plane may start in setup
def test_a_drain_evicts_what_the_budget_allows_refuses_the_rest_and_the_job_recovers_for_free(
        installed: Installed):
    kube = installed.kube
    start_example(installed, JOB, LONGER)
    # Mid-run: a first snapshot taken (the replacement resumes from it) and every budgeted pod Ready.
    wait(installed, lambda: ((kube.get("ddpjobs", JOB).get("status") or {}).get("lastSnapshot") or {}).get("step")
         and all(ready(kube, p) for p in BUDGETED), JOB_SECONDS, "a first snapshot with every budgeted pod Ready")
    # The job at its size: the operator asks one below the 3 Ready pods (render/pdb.py), and the
    # disruption controller turns that into one disruption allowed.
    computed = wait(installed, lambda: (s := budget_status(kube)).get("currentHealthy") == 3 and s, 60,
                    "the disruption controller's status of the budget with the 3 pods Ready")
    assert (computed["expectedPods"], computed["desiredHealthy"], computed["disruptionsAllowed"]) == (3, 2, 1), \
        computed
    assert job_phase(kube, JOB) == C.PHASE_RUNNING, "evicted mid-run, not after the end"
    victim = kube.get("pods", f"{JOB}-node-1")
    evict(kube, victim["metadata"]["name"])
    # At once, before anyone reacts: the API server itself took the allowed disruption when it
    # evicted (status.disruptedPods), so the budget allows none until the operator lowers it.
    with pytest.raises(ApiError) as refused:
        evict(kube, f"{JOB}-node-0")
    assert refused.value.status == 429, refused.value.body
    assert "disruption budget" in str(refused.value.body), refused.value.body
    assert kube.find("pods", f"{JOB}-node-0")["metadata"].get("deletionTimestamp") is None, \
        "the refused eviction left the pod alone"

    wait(installed, lambda: (p := kube.find("pods", victim["metadata"]["name"])) is not None
         and p["metadata"]["uid"] != victim["metadata"]["uid"], JOB_SECONDS, "the operator replacing the evicted pod")
    replaced = kube.get("ddpjobs", JOB)["status"]
    assert replaced.get("restarts", 0) == 0, f"an eviction uses no restart of the budget: {replaced}"
    status = wait_finished(installed, JOB)
    assert status["phase"] == C.PHASE_SUCCEEDED, f"{status}\n{diagnosis(kube, installed.kubelets)}"
    recorded = [f for f in status.get("failures") or [] if f.get("podUID") == victim["metadata"]["uid"]]
    assert recorded and recorded[0]["cause"] == C.CAUSE_DISRUPTED, status.get("failures")
    assert recorded[0]["reason"] == "EvictionByEvictionAPI", "the API server's DisruptionTarget reason"

    # The history as a user reads it: Events on the DDPJob, from the real API server.
    described = kube.kubectl("describe", "ddpjob", JOB).stdout
    events = described[described.index("Events:"):]
    for reason in (C.REASON_CREATED, C.REASON_NODE_DISRUPTED, C.REASON_SUCCEEDED):
        assert reason in events, f"{reason} missing from the Events of kubectl describe:\n{described}"
    assert victim["metadata"]["name"] in events, described


LOST = "kubelet-lost"
UNREACHABLE = "node.kubernetes.io/unreachable"
FORCE_AFTER_SECONDS = 5


def node_ready(kube: KubeClient, name: str) -> str | None:
    node = kube.get("nodes", name)
    return next((c["status"] for c in node["status"].get("conditions") or [] if c["type"] == "Ready"), None)


def set_unschedulable(kube: KubeClient, names, value: bool) -> None:
    for name in names:
        kube.patch("nodes", name, {"spec": {"unschedulable": value or None}})


@pytest.mark.slow  # a Node lost for good, then a training on the others (~3-4 min on a loaded 2-core machine)
@pytest.mark.timeout(OPERATOR_READY_SECONDS + 2 * JOB_SECONDS + 180)
def test_a_node_that_stops_renewing_its_lease_is_tainted_and_the_job_recovers_on_the_others(
        installed: Installed, control_plane, tmp_path):
    """The Node of every pod of the job goes silent (its kubelet stopped: no Lease, no status,
    its processes gone): the real node-lifecycle controller marks it Unknown and taints it
    unreachable, the taint-eviction controller deletes the pods (which stay Terminating: no
    kubelet will confirm), the operator force-deletes them (decide/stuck.py) and the job
    trains to Succeeded on the remaining Nodes."""
    kube = installed.kube
    others = [k.name for k in installed.kubelets]
    lost = make_kubelet(control_plane.layout.pki, control_plane.url, LOST, tmp_path,
                        heartbeat_seconds=HEARTBEAT_SECONDS, poll_seconds=0.2)
    lost.start()
    stopped = False
    try:
        # Every pod of the job on the Node to lose: the others closed to new pods until they run.
        set_unschedulable(kube, others, True)
        body = example_body("lost", LONGER)
        body["spec"]["scheduling"]["tolerations"] = [  # the user's choice: give up on a lost node at once
            {"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 1}]
        body["spec"]["failurePolicy"]["forceDeleteTerminatingAfterSeconds"] = FORCE_AFTER_SECONDS
        body["spec"]["snapshot"]["gracefulStopSeconds"] = 3
        # A claim of its own: the snapshots of one claim are the job's to resume from, so on the
        # drain test's claim this job would resume from that job's final snapshot and finish at once.
        body["spec"]["snapshot"]["volume"] = {"persistentVolumeClaim": {"claimName": "mlp-managed-snapshots"}}
        submit(installed, body)
        # The store pod (no nodeSelector: render/common.py) goes there too; the node pods must.
        first = {p: wait(installed, lambda p=p: ready(kube, p) and kube.get("pods", p), JOB_SECONDS,
                         f"{p} Ready on {LOST}") for p in ("lost-node-0", "lost-node-1")}
        assert {p["spec"]["nodeName"] for p in first.values()} == {LOST}, {n: p["spec"]["nodeName"]
                                                                           for n, p in first.items()}
        wait(installed, lambda: ((kube.get("ddpjobs", "lost").get("status") or {}).get("lastSnapshot") or {})
             .get("step"), JOB_SECONDS, "a first snapshot")
        set_unschedulable(kube, others, False)
        assert job_phase(kube, "lost") == C.PHASE_RUNNING, "the Node lost mid-run, not after the end"
        lost.stop()
        stopped = True

        grace = control_plane.layout.node_monitor_grace_seconds
        wait(installed, lambda: node_ready(kube, LOST) == "Unknown" and any(
            t["key"] == UNREACHABLE and t["effect"] == "NoExecute" for t in kube.get("nodes", LOST)["spec"]
            .get("taints") or []), grace + 60, f"the node-lifecycle controller marking {LOST} Unknown, unreachable")
        for name, old in first.items():
            wait(installed, lambda name=name, old=old: (p := kube.find("pods", name)) is not None
                 and p["metadata"]["uid"] != old["metadata"]["uid"] and p["spec"].get("nodeName") in others,
                 JOB_SECONDS, f"{name} replaced on a remaining node")
        status = wait_finished(installed, "lost")
        assert status["phase"] == C.PHASE_SUCCEEDED, f"{status}\n{diagnosis(kube, installed.kubelets)}"
        lost_uids = {first[p]["metadata"]["uid"] for p in ("lost-node-0", "lost-node-1")}
        causes = {f["podUID"]: f["cause"] for f in status.get("failures") or [] if f.get("podUID") in lost_uids}
        assert causes == {uid: C.CAUSE_NODE_LOST for uid in lost_uids}, status.get("failures")
        assert status.get("restarts", 0) == 0, f"a lost node uses no restart of the budget: {status}"
        forced = [e for e in kube.list("events", field_selector="involvedObject.name=lost")
                  if e["reason"] == C.REASON_FORCE_DELETED]
        assert {p for p in first if any(p in e["message"] for e in forced)} >= {"lost-node-0", "lost-node-1"}, \
            [e["message"] for e in forced]
    finally:
        set_unschedulable(kube, others, False)
        if not stopped:
            lost.stop()
        kube.delete("nodes", LOST)
