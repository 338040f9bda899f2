"""The real operator over HTTP against the API emulator: each job keeps one PodDisruptionBudget.

Created with the job's first pass, patched when `kubectl scale` or a spec edit changes the
job's size, deleted when the job turns it off, and deleted with the job by garbage
collection (it is owned by the job). Without the grant the job runs without one, and the
operator's log says what is missing, once.
"""
from __future__ import annotations

import pytest

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.job_ref import JobRef
from ddpjob_sandbox.jobs import make_manifest
from ddpjob_sandbox.readers import pod_names
from ddpjob_sandbox.scripted import set_running


def min_available(k8s, name: str = "mlp") -> int | None:
    budget = k8s.find("poddisruptionbudgets", name)
    return None if budget is None else budget["spec"]["minAvailable"]


def test_a_jobs_budget_is_created_patched_on_scale_and_deleted_with_the_job(k8s, operator):
    job = k8s.create("ddpjobs", make_manifest(replicas=2, elasticPolicy={"minReplicas": 2, "maxReplicas": 6}))
    budget = k8s.wait_for(lambda: k8s.find("poddisruptionbudgets", "mlp"), timeout=15, what="the budget")
    assert budget["spec"]["minAvailable"] == 0  # nothing Ready yet: nothing to keep, and a drain is never held
    assert budget["metadata"]["ownerReferences"][0]["uid"] == JobRef.from_body(job).uid
    k8s.wait_for(lambda: pod_names(k8s) == ["mlp-node-0", "mlp-node-1"], timeout=15, what="two node pods")
    for name in ["mlp-rdzv"] + pod_names(k8s):
        set_running(k8s, name)
    k8s.wait_for(lambda: min_available(k8s) == 1 + 1, timeout=15,
                 what="the budget of the whole job: at its minimum, one node pod at a time, + the store pod")

    k8s.kubectl("scale", "ddpjob/mlp", "--replicas=5")
    # Three more node pods are created, none Ready: the 3 Ready pods less one may stay, not minReplicas + store.
    k8s.wait_for(lambda: len(pod_names(k8s)) == 5, timeout=15, what="five node pods")
    k8s.wait_for(lambda: min_available(k8s) == 3 - 1, timeout=15, what="the budget kept one below the Ready pods")
    for name in pod_names(k8s):
        set_running(k8s, name)
    k8s.wait_for(lambda: min_available(k8s) == 2 + 1, timeout=15, what="the budget patched to minReplicas + store")
    k8s.patch("ddpjobs", "mlp", {"spec": {"replicas": 2}})
    k8s.wait_for(lambda: min_available(k8s) == 1 + 1, timeout=15, what="the budget patched back after a spec edit")
    assert len(k8s.list("poddisruptionbudgets")) == 1

    k8s.patch("ddpjobs", "mlp", {"spec": {"runPolicy": {"podDisruptionBudget": False}}})
    k8s.wait_for(lambda: k8s.find("poddisruptionbudgets", "mlp") is None, timeout=15,
                 what="the budget deleted when the job turns it off")
    k8s.patch("ddpjobs", "mlp", {"spec": {"runPolicy": {"podDisruptionBudget": True}}})
    k8s.wait_for(lambda: k8s.find("poddisruptionbudgets", "mlp"), timeout=15, what="the budget again")
    k8s.delete("ddpjobs", "mlp")
    k8s.wait_for(lambda: k8s.find("poddisruptionbudgets", "mlp") is None, timeout=15,
                 what="garbage collection to delete the budget with its job")


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_without_the_grant_the_job_still_runs_and_the_log_says_so_once(cluster, k8s, operator, method):  # noqa: F811
    cluster.emulator.forbidden.add((method, "poddisruptionbudgets"))
    if method == "GET":  # the operator's cache listed them before: its watch ends, and the list again is refused
        cluster.emulator.expire("poddisruptionbudgets")
    k8s.create("ddpjobs", make_manifest(replicas=2))
    k8s.wait_for(lambda: pod_names(k8s) == ["mlp-node-0", "mlp-node-1"], timeout=30, what="two node pods")
    for name in pod_names(k8s):
        set_running(k8s, name)
    k8s.wait_for(lambda: (k8s.get("ddpjobs", "mlp").get("status") or {}).get("phase") == C.PHASE_RUNNING,
                 timeout=30, what="the job running")
    warnings = [line for line in operator.log().splitlines() if "Cannot manage PodDisruptionBudgets" in line]
    assert len(warnings) == 1, warnings  # once per namespace, not once per pass
    assert "grant list, watch, create, patch and delete on policy poddisruptionbudgets (the chart does)" in warnings[0]
    cluster.emulator.forbidden.clear()
    assert k8s.find("poddisruptionbudgets", "mlp") is None
