"""The real operator runs a job's managed etcd: created and owned with the job, replaced when lost,
deleted when the job finishes, and the job's node pods point at it."""
from __future__ import annotations

import time

from ddpjob_sandbox.jobs import make_manifest
from ddpjob_sandbox.readers import pod_names, status
from ddpjob_sandbox.scripted import set_running, set_terminated

MANAGED = {"rdzvBackend": "etcd-v3", "managedEtcd": {"enabled": True}}


def env_of(pod: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}


def test_the_managed_etcd_comes_with_the_job_and_goes_when_it_finishes(k8s, operator):
    uid = k8s.create("ddpjobs", make_manifest(replicas=2, elasticPolicy=MANAGED))["metadata"]["uid"]

    etcd = k8s.wait_for(lambda: k8s.find("pods", "mlp-etcd"), timeout=15, what="the etcd pod")
    service = k8s.wait_for(lambda: k8s.find("services", "mlp-etcd"), timeout=15, what="the etcd Service")
    k8s.wait_for(lambda: pod_names(k8s) == ["mlp-node-0", "mlp-node-1"], timeout=15, what="two node pods")
    for obj in (etcd, service):
        assert obj["metadata"]["ownerReferences"][0]["uid"] == uid
    assert env_of(k8s.get("pods", "mlp-node-1"))["PET_RDZV_ENDPOINT"] == (
        f"mlp-etcd.{k8s.namespace}.svc.cluster.local:2379")
    assert not k8s.get("ddpjobs", "mlp")["metadata"].get("finalizers"), "no keys outside the job to clean"

    for name in pod_names(k8s):
        set_running(k8s, name)
    k8s.wait_for(lambda: status(k8s).get("readyReplicas") == 2, timeout=15, what="both nodes counted")
    assert status(k8s)["replicas"] == 2, "the etcd pod must not count as a node"

    for name in pod_names(k8s):
        set_terminated(k8s, name, 0)
    k8s.wait_for(lambda: status(k8s).get("phase") == "Succeeded", timeout=15, what="the job to succeed")
    k8s.wait_for(lambda: k8s.find("pods", "mlp-etcd") is None, timeout=15, what="the etcd pod deleted")
    assert k8s.find("services", "mlp-etcd") is not None  # owned: garbage collection takes it with the job


def test_a_lost_etcd_pod_is_created_again(k8s, operator):
    k8s.create("ddpjobs", make_manifest(replicas=1, elasticPolicy=MANAGED))
    first = k8s.wait_for(lambda: k8s.find("pods", "mlp-etcd"), timeout=15, what="the etcd pod")
    k8s.wait_for(lambda: pod_names(k8s) == ["mlp-node-0"], timeout=15, what="the node pod")
    set_running(k8s, "mlp-node-0")
    k8s.wait_for(lambda: status(k8s).get("readyReplicas") == 1, timeout=15, what="the node counted")
    time.sleep(1)  # quiet: only the etcd pod's own events can start the next pass

    k8s.delete("pods", "mlp-etcd")  # e.g. its node was drained

    k8s.wait_for(lambda: (k8s.find("pods", "mlp-etcd") or first)["metadata"]["uid"] != first["metadata"]["uid"],
                 timeout=15, what="a new etcd pod")
    assert pod_names(k8s) == ["mlp-node-0"], "losing the etcd pod must not touch the node pods"
