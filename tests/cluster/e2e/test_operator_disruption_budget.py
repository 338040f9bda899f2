"""The helm-installed operator on the real control plane: each job keeps one PodDisruptionBudget.
Created with the job's first pass, patched when `kubectl scale` or a spec edit changes the
job's size, deleted when the job turns it off, and deleted with the job by the real garbage
collector (it is owned by the job). A drain through the Eviction API against that budget:
tests/cluster/test_disruptions_on_cluster.py.
"""
from __future__ import annotations

import pytest

from ddpjob_operator.api.job_ref import JobRef
from ddpjob_sandbox.readers import pod_names
from ddpjob_sandbox.scripted import set_running
from tests.cluster.operators import status_manifest, store_running

pytestmark = pytest.mark.cluster


def min_available(kube, name: str) -> int | None:
    budget = kube.find("poddisruptionbudgets", name)
    return None if budget is None else budget["spec"]["minAvailable"]


def test_a_jobs_budget_is_created_patched_on_scale_and_deleted_with_the_job(operator):
    kube, name = operator.kube, operator.job
    job = kube.create("ddpjobs", status_manifest(name, replicas=2, elasticPolicy={
        "minReplicas": 2, "maxReplicas": 6, "rdzvStore": "pod"}))
    budget = kube.wait_for(lambda: kube.find("poddisruptionbudgets", name), timeout=15, what="the budget")
    assert budget["spec"]["minAvailable"] == 0  # nothing Ready yet: nothing to keep, and a drain is never held
    assert budget["metadata"]["ownerReferences"][0]["uid"] == JobRef.from_body(job).uid
    nodes = [f"{name}-node-0", f"{name}-node-1"]
    kube.wait_for(lambda: pod_names(kube, name) == nodes, timeout=15, what="two node pods")
    store_running(operator, f"{name}-rdzv")
    for pod in nodes:
        set_running(kube, pod)
    kube.wait_for(lambda: min_available(kube, name) == 1 + 1, timeout=15,
                  what="the budget of the whole job: at its minimum, one node pod at a time, + the store pod")
    kube.kubectl("scale", f"ddpjob/{name}", "--replicas=5")
    # Three more node pods are created, none Ready: the 3 Ready pods less one may stay, not minReplicas + store.
    kube.wait_for(lambda: len(pod_names(kube, name)) == 5, timeout=15, what="five node pods")
    kube.wait_for(lambda: min_available(kube, name) == 3 - 1, timeout=15, what="the budget kept one below the Ready pods")
    for pod in pod_names(kube, name):
        set_running(kube, pod)
    kube.wait_for(lambda: min_available(kube, name) == 2 + 1, timeout=15,
                  what="the budget patched to minReplicas + store")
    kube.patch("ddpjobs", name, {"spec": {"replicas": 2}})
    kube.wait_for(lambda: min_available(kube, name) == 1 + 1, timeout=15, what="the budget patched back after a spec edit")
    # One budget for the whole job. Only its own are counted: earlier tests' jobs share the namespace,
    # and the garbage collector deletes their budgets when it gets to them.
    owned = [b["metadata"]["name"] for b in kube.list("poddisruptionbudgets")
             if any(ref["uid"] == job["metadata"]["uid"] for ref in b["metadata"].get("ownerReferences") or ())]
    assert owned == [name]
    # The real disruption controller reads the budget: the job's Ready pods count as healthy.
    kube.wait_for(lambda: ((kube.get("poddisruptionbudgets", name).get("status") or {}).get("currentHealthy") or 0) >= 2,
                  timeout=30, what="the disruption controller's status of the budget")
    kube.patch("ddpjobs", name, {"spec": {"runPolicy": {"podDisruptionBudget": False}}})
    kube.wait_for(lambda: kube.find("poddisruptionbudgets", name) is None, timeout=15,
                  what="the budget deleted when the job turns it off")
    kube.patch("ddpjobs", name, {"spec": {"runPolicy": {"podDisruptionBudget": True}}})
    kube.wait_for(lambda: kube.find("poddisruptionbudgets", name), timeout=15, what="the budget again")
    kube.delete("ddpjobs", name)
    kube.wait_for(lambda: kube.find("poddisruptionbudgets", name) is None, timeout=60,
                  what="the garbage collector deleting the budget with its job")
