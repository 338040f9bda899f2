"""Without the grant on PodDisruptionBudgets or NetworkPolicies a job still runs, and the operator's
log says what is missing, once. The helm-installed operator on the real control plane, its RBAC the
chart's Role with the rule's verbs taken out (a patch of the Role after the install), then its pod
restarted: RBAC is checked per request, but a watch already open stays open, so only a fresh
operator meets the refusal at its first list (GET) or at its first create (POST)."""
from __future__ import annotations

import copy

import pytest

from ddpjob_operator.api import constants as C
from ddpjob_sandbox.readers import pod_names
from ddpjob_sandbox.scripted import set_running
from tests.cluster.installed_operator import OPERATOR_READY_SECONDS, installed_operator, operator_selector, wait
from tests.cluster.operators import RELEASE_ENV, Operated, clean, status_manifest, unique_job_name, wait_handling_jobs

pytestmark = pytest.mark.cluster

RELEASE = "ddpjob-grants"
# The verbs a request of each method needs: GET is the cache's list and watch, POST the create.
VERBS = {"GET": {"list", "watch"}, "POST": {"create"}}


@pytest.fixture(scope="module")
def granted(control_plane, kubelets, status_nodes, tmp_path_factory):
    """A release of its own (its Role is changed by these tests) and the chart's Role as installed."""
    with installed_operator(control_plane, kubelets, tmp_path_factory, release=RELEASE, extra_env=RELEASE_ENV) as installed:
        (role,) = [r for r in installed.kube.list("roles", label_selector=f"app.kubernetes.io/instance={RELEASE}")
                   if any("poddisruptionbudgets" in rule.get("resources", []) for rule in r["rules"])]
        yield installed, role


def operator_pods(kube) -> list[str]:
    return [p["metadata"]["name"] for p in kube.list("pods", label_selector=operator_selector(RELEASE))
            if not p["metadata"].get("deletionTimestamp")]


def without_grant(granted, resource: str, verbs: set[str]) -> str:
    """The chart's Role with ``verbs`` on ``resource`` taken out, and the operator's pod restarted
    so that it lists and creates under it; returns the new operator pod's name."""
    installed, role = granted
    kube = installed.kube
    rules = copy.deepcopy(role["rules"])
    for rule in rules:
        if resource in rule.get("resources", []):
            rule["verbs"] = [v for v in rule["verbs"] if v not in verbs]
    kube.patch("roles", role["metadata"]["name"], [{"op": "replace", "path": "/rules", "value": rules}],
               patch_type="json")
    (old,) = operator_pods(kube)
    kube.delete("pods", old)
    new = wait(installed, lambda: (pods := [p for p in operator_pods(kube) if p != old]) and pods[0],
               OPERATOR_READY_SECONDS, "the Deployment's new operator pod")
    wait_handling_jobs(installed)
    return new


def run_two_node_job(installed, job: str) -> None:
    """Job ``job`` of two node pods on the status-only Nodes, both reported Running, and the job Running."""
    kube = installed.kube
    kube.create("ddpjobs", status_manifest(job, replicas=2))
    kube.wait_for(lambda: pod_names(kube, job) == [f"{job}-node-0", f"{job}-node-1"]
                  and all(kube.get("pods", n)["spec"].get("nodeName") for n in pod_names(kube, job)),
                  timeout=30, what="two node pods placed")
    for name in pod_names(kube, job):
        set_running(kube, name)
    wait(installed, lambda: (kube.get("ddpjobs", job).get("status") or {}).get("phase") == C.PHASE_RUNNING,
         30, "the job running")


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_without_the_budget_grant_the_job_still_runs_and_the_log_says_so_once(granted, method):
    installed = granted[0]
    pod = without_grant(granted, "poddisruptionbudgets", VERBS[method])
    kube, job = installed.kube, unique_job_name()
    try:
        run_two_node_job(installed, job)
        log = installed.pod_log(pod)
        warnings = [line for line in log.splitlines() if "Cannot manage PodDisruptionBudgets" in line]
        assert len(warnings) == 1, warnings  # once per namespace, not once per pass
        assert "grant list, watch, create, patch and delete on policy poddisruptionbudgets (the chart does)" in warnings[0]
        assert kube.find("poddisruptionbudgets", job) is None
    finally:
        clean(Operated(installed, job))
    assert "Traceback" not in installed.pod_log(pod)


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_without_the_network_policy_grant_the_job_still_runs_and_the_log_says_what_is_missing(granted, method):
    installed = granted[0]
    pod = without_grant(granted, "networkpolicies", VERBS[method])
    kube, job = installed.kube, unique_job_name()
    try:
        run_two_node_job(installed, job)
        warnings = [line for line in installed.pod_log(pod).splitlines() if "Cannot manage NetworkPolicies" in line]
        assert len(warnings) == 1, warnings  # once per namespace, not once per pass
        assert (f"Cannot manage NetworkPolicies in {kube.namespace} (" in warnings[0]
                and "grant list, watch and create on networking.k8s.io networkpolicies (the chart does)" in warnings[0])
        assert kube.find("networkpolicies", job) is None
    finally:
        clean(Operated(installed, job))
    assert "Traceback" not in installed.pod_log(pod)
