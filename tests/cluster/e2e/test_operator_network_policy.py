"""The helm-installed operator on the real control plane: each job gets one NetworkPolicy, owned by it.

Created with the job's first pass and before any pod, never created twice however many passes
follow (each pass looks for it in the operator's cache, fed by a watch, like the Service: no GET
per pass), put back when someone edits it, deleted with the job by the real garbage collector,
and left alone when the job turns it off. The operator runs with the flags the chart passes for
where its own pods are. Its requests are counted from the API server's audit log.
"""
from __future__ import annotations

import pytest

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.job_ref import JobRef
from ddpjob_operator.render.network_policy import OperatorPeer, render_network_policy
from ddpjob_sandbox.readers import pod_names, status
from ddpjob_sandbox.scripted import set_running
from tests.cluster.installed_operator import audit_events, audit_offset
from tests.cluster.operators import status_manifest

pytestmark = pytest.mark.cluster


def peer(operator) -> OperatorPeer:
    """Who the chart says the operator's pods are (--operator-namespace, --operator-pod-selector)."""
    return OperatorPeer(((C.LABEL_APP_NAME, "ddpjob-operator"),
                         ("app.kubernetes.io/instance", operator.installed.release)), operator.kube.namespace)


def policy_requests(control_plane, operator, verb: str, since: int) -> list[str]:
    """The request paths of the operator's ``verb`` requests on NetworkPolicies (the test's own left out)."""
    return [e["requestURI"].split("?")[0] for e in audit_events(control_plane, since)
            if (e["verb"], e["user"]["username"]) == (verb, operator.account)
            and (e.get("objectRef") or {}).get("resource") == "networkpolicies"]


def test_a_job_gets_one_network_policy_which_goes_with_the_job(operator, control_plane):
    kube, name = operator.kube, operator.job
    since = audit_offset(control_plane)
    job = kube.create("ddpjobs", status_manifest(name, replicas=2))
    policy = kube.wait_for(lambda: kube.find("networkpolicies", name), timeout=15, what="the NetworkPolicy")

    expected = render_network_policy(JobRef.from_body(job), peer(operator))
    assert policy["spec"] == expected["spec"]
    assert policy["metadata"]["labels"] == expected["metadata"]["labels"]
    assert policy["metadata"]["ownerReferences"] == [{**expected["metadata"]["ownerReferences"][0],
                                                      "uid": job["metadata"]["uid"]}]

    # Later passes (pods starting, running) look for it in the cache and create nothing.
    kube.wait_for(lambda: pod_names(kube, name) == [f"{name}-node-0", f"{name}-node-1"], timeout=15,
                  what="two node pods")
    for pod in pod_names(kube, name):
        set_running(kube, pod)
    kube.wait_for(lambda: status(kube, name).get("phase") == C.PHASE_RUNNING, timeout=15,
                  what="the passes that see the job running")
    collection = f"/apis/networking.k8s.io/v1/namespaces/{kube.namespace}/networkpolicies"
    assert policy_requests(control_plane, operator, "create", since) == [collection]
    # The release's cache listed them once, before this test: its passes read none.
    assert policy_requests(control_plane, operator, "get", since) == []
    assert policy_requests(control_plane, operator, "list", since) == []
    assert [p["metadata"]["name"] for p in kube.list("networkpolicies")] == [name]

    kube.delete("ddpjobs", name)
    kube.wait_for(lambda: kube.find("networkpolicies", name) is None, timeout=60,
                  what="the garbage collector deleting the NetworkPolicy with its job")


def test_a_job_that_turns_it_off_gets_none_and_costs_no_request(operator, control_plane):
    kube, opened, closed = operator.kube, operator.name("open"), operator.name("closed")
    since = audit_offset(control_plane)
    kube.create("ddpjobs", status_manifest(opened, replicas=1, networkPolicy={"enabled": False}))
    kube.create("ddpjobs", status_manifest(closed, replicas=1))
    kube.wait_for(lambda: pod_names(kube, opened) == [f"{opened}-node-0"] and kube.find("networkpolicies", closed),
                  timeout=15, what="both jobs' pods and the closed job's NetworkPolicy")
    assert [p["metadata"]["name"] for p in kube.list("networkpolicies")] == [closed]
    assert not [path for verb in ("get", "create", "patch")
                for path in policy_requests(control_plane, operator, verb, since) if path.endswith(f"/{opened}")]


def test_the_policy_comes_before_any_pod_and_an_edit_of_it_is_put_back(operator, control_plane):
    kube, name = operator.kube, operator.job
    since = audit_offset(control_plane)
    kube.create("ddpjobs", status_manifest(name, replicas=2))
    kube.wait_for(lambda: pod_names(kube, name) == [f"{name}-node-0", f"{name}-node-1"], timeout=15,
                  what="two node pods")
    creates = [(e.get("objectRef") or {}).get("resource") for e in audit_events(control_plane, since)
               if (e["verb"], e["user"]["username"]) == ("create", operator.account)
               and (e.get("objectRef") or {}).get("resource") != "events"]
    assert creates.index("networkpolicies") < creates.index("pods"), creates
    condition = kube.wait_for(lambda: next((c for c in status(kube, name).get("conditions") or []
                                            if c["type"] == C.COND_NETWORK_POLICY and c["status"] == "True"), None),
                              timeout=15, what="the NetworkPolicyReady condition")
    assert condition["reason"] == "Present"

    original = kube.get("networkpolicies", name)["spec"]
    kube.patch("networkpolicies", name, {"spec": {"ingress": [{}], "podSelector": {"matchExpressions": [
        {"key": "nothing", "operator": "Exists"}]}}})  # admit everyone, select nothing of the job
    kube.wait_for(lambda: kube.get("networkpolicies", name)["spec"] == original, timeout=15,
                  what="the edited NetworkPolicy put back")
