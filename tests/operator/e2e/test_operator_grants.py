"""Without the grant on PodDisruptionBudgets or NetworkPolicies a job still runs, and the operator's
log says what is missing, once. Real operator against the API emulator.

Why still the emulator: not yet ported. On the real control plane the refusal is the chart's
RBAC with the rule taken out of its Role, and the GET case needs the operator's watch to end
and its list again to be refused (a restart of its pod); the rest of
test_operator_disruption_budget.py and test_operator_network_policy.py runs on the real control
plane (tests/cluster/e2e/).
"""
from __future__ import annotations

import pytest

from ddpjob_operator.api import constants as C
from ddpjob_sandbox.jobs import make_manifest
from ddpjob_sandbox.readers import pod_names
from ddpjob_sandbox.scripted import set_running


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_without_the_budget_grant_the_job_still_runs_and_the_log_says_so_once(cluster, k8s, operator, method):  # noqa: F811
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


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_without_the_network_policy_grant_the_job_still_runs_and_the_log_says_what_is_missing(cluster, k8s, operator, method):  # noqa: F811
    cluster.emulator.forbidden.add((method, "networkpolicies"))
    if method == "GET":  # the operator listed them before: its watch ends, and the list again is refused
        cluster.emulator.expire("networkpolicies")
    k8s.create("ddpjobs", make_manifest(replicas=2))
    k8s.wait_for(lambda: pod_names(k8s) == ["mlp-node-0", "mlp-node-1"], timeout=15, what="two node pods")
    for name in pod_names(k8s):
        set_running(k8s, name)
    k8s.wait_for(lambda: (k8s.get("ddpjobs", "mlp").get("status") or {}).get("phase") == C.PHASE_RUNNING,
                 timeout=15, what="the job running")

    warnings = [line for line in operator.log().splitlines() if "Cannot manage NetworkPolicies" in line]
    assert len(warnings) == 1, warnings  # once per namespace, not once per pass
    assert (f"Cannot manage NetworkPolicies in {k8s.namespace} (" in warnings[0]
            and "grant list, watch and create on networking.k8s.io networkpolicies (the chart does)" in warnings[0])
    cluster.emulator.forbidden.clear()
    assert k8s.find("networkpolicies", "mlp") is None
