"""The real operator over HTTP against the API emulator: each job keeps one PodDisruptionBudget.

Created with the job's first pass, patched when `kubectl scale` or a spec edit changes the
job's size, deleted when the job turns it off, and deleted with the job by garbage
collection (it is owned by the job).
"""
from __future__ import annotations

from ddpjob_operator.api.spec import JobRef
from ddpjob_sandbox.jobs import make_manifest


def min_available(k8s, name: str = "mlp") -> int | None:
    budget = k8s.find("poddisruptionbudgets", name)
    return None if budget is None else budget["spec"]["minAvailable"]


def test_a_jobs_budget_is_created_patched_on_scale_and_deleted_with_the_job(k8s, operator):
    job = k8s.create("ddpjobs", make_manifest(replicas=2, elasticPolicy={"minReplicas": 2, "maxReplicas": 6}))
    budget = k8s.wait_for(lambda: k8s.find("poddisruptionbudgets", "mlp"), timeout=15, what="the budget")
    assert budget["spec"]["minAvailable"] == 1 + 1  # at its minimum: one node pod at a time, + the store pod
    assert budget["metadata"]["ownerReferences"][0]["uid"] == JobRef.from_body(job).uid

    k8s.kubectl("scale", "ddpjob/mlp", "--replicas=5")
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
