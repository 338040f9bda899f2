"""The real operator over HTTP against the API emulator: each job gets one NetworkPolicy, owned by it.

Created with the job's first pass, never created twice however many passes follow (each
pass looks for it in the operator's cache, fed by a watch, like the Service: no GET per pass), deleted with the job by garbage collection, and
left alone when the job turns it off. The operator runs with the flags that say where its
own pods are, as the chart passes them.
"""
from __future__ import annotations

import pytest

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.job_ref import JobRef
from ddpjob_operator.render.network_policy import OperatorPeer, render_network_policy
from ddpjob_sandbox.jobs import make_manifest
from ddpjob_sandbox.readers import pod_names
from ddpjob_sandbox.scripted import set_running

FLAGS = ("--operator-namespace", "ops", "--operator-pod-selector", "app.kubernetes.io/name=ops-pods")
PEER = OperatorPeer(((C.LABEL_APP_NAME, "ops-pods"),), "ops")


def policy_requests(cluster, method: str) -> list[str]:  # noqa: F811
    """Paths of the operator's requests with ``method`` on NetworkPolicies (the test's own are left out)."""
    return [request.url.path for request in list(cluster.emulator)
            if str(request.method.value).upper() == method and "/networkpolicies" in request.url.path
            and request.headers.get("User-Agent", "").startswith(C.MANAGED_BY)]


@pytest.mark.operator_args(*FLAGS)
def test_a_job_gets_one_network_policy_which_goes_with_the_job(cluster, k8s, operator):  # noqa: F811
    job = k8s.create("ddpjobs", make_manifest(replicas=2))
    policy = k8s.wait_for(lambda: k8s.find("networkpolicies", "mlp"), timeout=15, what="the NetworkPolicy")

    expected = render_network_policy(JobRef.from_body(job), PEER)
    assert policy["spec"] == expected["spec"]
    assert policy["metadata"]["labels"] == expected["metadata"]["labels"]
    assert policy["metadata"]["ownerReferences"] == [{**expected["metadata"]["ownerReferences"][0],
                                                      "uid": job["metadata"]["uid"]}]

    # Later passes (pods starting, running) look for it in the cache and create nothing.
    k8s.wait_for(lambda: pod_names(k8s) == ["mlp-node-0", "mlp-node-1"], timeout=15, what="two node pods")
    for name in pod_names(k8s):
        set_running(k8s, name)
    k8s.wait_for(lambda: (k8s.get("ddpjobs", "mlp").get("status") or {}).get("phase") == C.PHASE_RUNNING,
                 timeout=15, what="the passes that see the job running")
    assert policy_requests(cluster, "POST") == [f"/apis/networking.k8s.io/v1/namespaces/{k8s.namespace}/networkpolicies"]
    assert policy_requests(cluster, "GET") == [  # the cache's one LIST; its watch is a GET with ?watch=true
        f"/apis/networking.k8s.io/v1/namespaces/{k8s.namespace}/networkpolicies"] * 2
    assert len(k8s.list("networkpolicies")) == 1

    k8s.delete("ddpjobs", "mlp")
    k8s.wait_for(lambda: k8s.find("networkpolicies", "mlp") is None, timeout=15,
                 what="garbage collection to delete the NetworkPolicy with its job")


@pytest.mark.operator_args(*FLAGS)
def test_a_job_that_turns_it_off_gets_none_and_costs_no_request(cluster, k8s, operator):  # noqa: F811
    k8s.create("ddpjobs", make_manifest(name="open", replicas=1, networkPolicy={"enabled": False}))
    k8s.create("ddpjobs", make_manifest(name="closed", replicas=1))
    k8s.wait_for(lambda: pod_names(k8s, "open") == ["open-node-0"] and k8s.find("networkpolicies", "closed"),
                 timeout=15, what="both jobs' pods and the closed job's NetworkPolicy")

    assert [p["metadata"]["name"] for p in k8s.list("networkpolicies")] == ["closed"]
    assert not [path for path in policy_requests(cluster, "GET") + policy_requests(cluster, "POST")
                if path.endswith("/open")]


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_without_the_grant_the_job_still_runs_and_the_log_says_what_is_missing(cluster, k8s, operator, method):  # noqa: F811
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


def operator_posts(cluster) -> list[str]:
    """The collections the operator POSTed to, in order (Events left out)."""
    return [request.url.path.rsplit("/", 1)[-1] for request in list(cluster.emulator)
            if str(request.method.value).upper() == "POST" and not request.url.path.endswith("/events")
            and request.headers.get("User-Agent", "").startswith(C.MANAGED_BY)]


@pytest.mark.operator_args(*FLAGS)
def test_the_policy_comes_before_any_pod_and_an_edit_of_it_is_put_back(cluster, k8s, operator):  # noqa: F811
    k8s.create("ddpjobs", make_manifest(replicas=2))
    k8s.wait_for(lambda: pod_names(k8s) == ["mlp-node-0", "mlp-node-1"], timeout=15, what="two node pods")
    posts = operator_posts(cluster)
    assert posts.index("networkpolicies") < posts.index("pods"), posts
    condition = k8s.wait_for(lambda: next((c for c in (k8s.get("ddpjobs", "mlp").get("status") or {}).get(
        "conditions") or [] if c["type"] == C.COND_NETWORK_POLICY and c["status"] == "True"), None),
        timeout=15, what="the NetworkPolicyReady condition")
    assert condition["reason"] == "Present"

    original = k8s.get("networkpolicies", "mlp")["spec"]
    k8s.patch("networkpolicies", "mlp", {"spec": {"ingress": [{}], "podSelector": {"matchExpressions": [
        {"key": "nothing", "operator": "Exists"}]}}})  # admit everyone, select nothing of the job
    k8s.wait_for(lambda: k8s.get("networkpolicies", "mlp")["spec"] == original, timeout=15,
                 what="the edited NetworkPolicy put back")
