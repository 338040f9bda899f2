"""The real operator reads from its watch-fed cache (controller/cache.py): once it has listed,
its passes make no LIST and no GET, however many there are, and what happens behind its
back (a pod deleted by someone else) reaches it by the watch."""
from ddpjob_operator.api import constants as C
from ddpjob_sandbox.jobs import make_manifest
from ddpjob_sandbox.readers import pod_names
from ddpjob_sandbox.scripted import set_running

OPERATOR = (C.MANAGED_BY, "kopf")  # the User-Agents of the operator's two clients


def status(k8s, name="mlp"):
    return k8s.get("ddpjobs", name).get("status") or {}


def operator_requests(cluster):
    return cluster.emulator.request_counts(OPERATOR)


def test_steady_state_passes_make_no_list_and_no_get(cluster, k8s, operator):
    k8s.create("ddpjobs", make_manifest(replicas=2))
    k8s.wait_for(lambda: pod_names(k8s) == ["mlp-node-0", "mlp-node-1"] and status(k8s).get("replicas") == 2,
                 timeout=20, what="two node pods in the status")
    before = operator_requests(cluster)
    for name in pod_names(k8s):  # each pod event is a pass; the last one finds the job running
        set_running(k8s, name)
    k8s.wait_for(lambda: status(k8s).get("phase") == C.PHASE_RUNNING, timeout=20, what="the job running")
    after = operator_requests(cluster)
    assert (after["LIST"] - before["LIST"], after["GET"] - before["GET"]) == (0, 0)
    assert after["PATCH"] > before["PATCH"], "the passes ran: they wrote the new phase"


def test_a_pod_deleted_behind_the_operators_back_is_replaced_from_the_watch(cluster, k8s, operator):
    k8s.create("ddpjobs", make_manifest(replicas=2))
    k8s.wait_for(lambda: pod_names(k8s) == ["mlp-node-0", "mlp-node-1"], timeout=20, what="two node pods")
    old = k8s.get("pods", "mlp-node-1")["metadata"]["uid"]
    before = operator_requests(cluster)
    k8s.delete("pods", "mlp-node-1")
    k8s.wait_for(lambda: (p := k8s.find("pods", "mlp-node-1")) and p["metadata"]["uid"] != old,
                 timeout=20, what="the replacement pod")
    after = operator_requests(cluster)
    assert (after["LIST"] - before["LIST"], after["GET"] - before["GET"]) == (0, 0)
    assert after["POST"] > before["POST"], "the replacement was created"
