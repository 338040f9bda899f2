"""The helm-installed operator on the real control plane runs a job's managed etcd: created and
owned with the job, replaced when lost, deleted when the job finishes, and the job's node pods
point at it.

The etcd pod borrows the node pods' tolerations, not their nodeSelector (render/common.py
borrowed_scheduling), so the scheduler may put it on a kubelet's Node, which runs it, or on a
status-only Node, where the test reports it running (operators.store_running)."""
from __future__ import annotations

import time

import pytest

from ddpjob_sandbox.readers import pod_names, status
from ddpjob_sandbox.scripted import set_running, set_terminated
from tests.cluster.operators import status_manifest, store_running

pytestmark = pytest.mark.cluster

MANAGED = {"rdzvBackend": "etcd-v3", "managedEtcd": {"enabled": True}}


def env_of(pod: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}


def placed_nodes(kube, job, count):
    kube.wait_for(lambda: len(names := pod_names(kube, job)) == count
                  and all(kube.get("pods", n)["spec"].get("nodeName") for n in names), timeout=20,
                  what=f"{count} node pods placed")


def test_the_managed_etcd_comes_with_the_job_and_goes_when_it_finishes(operator):
    kube, job = operator.kube, operator.job
    etcd_name = f"{job}-etcd"
    uid = kube.create("ddpjobs", status_manifest(job, replicas=2, elasticPolicy=MANAGED))["metadata"]["uid"]

    etcd = kube.wait_for(lambda: kube.find("pods", etcd_name), timeout=15, what="the etcd pod")
    service = kube.wait_for(lambda: kube.find("services", etcd_name), timeout=15, what="the etcd Service")
    kube.wait_for(lambda: pod_names(kube, job) == [f"{job}-node-0", f"{job}-node-1"], timeout=15, what="two node pods")
    for obj in (etcd, service):
        assert obj["metadata"]["ownerReferences"][0]["uid"] == uid
    assert env_of(kube.get("pods", f"{job}-node-1"))["PET_RDZV_ENDPOINT"] == (
        f"{etcd_name}.{kube.namespace}.svc.cluster.local:2379")
    assert not kube.get("ddpjobs", job)["metadata"].get("finalizers"), "no keys outside the job to clean"
    store_running(operator, etcd_name)

    placed_nodes(kube, job, 2)
    for name in pod_names(kube, job):
        set_running(kube, name)
    kube.wait_for(lambda: status(kube, job).get("readyReplicas") == 2, timeout=15, what="both nodes counted")
    assert status(kube, job)["replicas"] == 2, "the etcd pod must not count as a node"

    for name in pod_names(kube, job):
        set_terminated(kube, name, 0)
    kube.wait_for(lambda: status(kube, job).get("phase") == "Succeeded", timeout=15, what="the job to succeed")
    # Deleted by the operator: gone once its Node removed it (a kubelet stops its process first).
    kube.wait_for(lambda: kube.find("pods", etcd_name) is None, timeout=30, what="the etcd pod deleted")
    assert kube.find("services", etcd_name) is not None  # owned: garbage collection takes it with the job


def test_a_lost_etcd_pod_is_created_again(operator):
    kube, job = operator.kube, operator.job
    etcd_name = f"{job}-etcd"
    kube.create("ddpjobs", status_manifest(job, replicas=1, elasticPolicy=MANAGED))
    first = kube.wait_for(lambda: kube.find("pods", etcd_name), timeout=15, what="the etcd pod")
    store_running(operator, etcd_name)
    placed_nodes(kube, job, 1)
    set_running(kube, f"{job}-node-0")
    kube.wait_for(lambda: status(kube, job).get("readyReplicas") == 1, timeout=15, what="the node counted")
    time.sleep(1)  # quiet: only the etcd pod's own events can start the next pass
    assert kube.get("pods", etcd_name)["metadata"]["uid"] == first["metadata"]["uid"], "replaced before it was lost"

    kube.delete("pods", etcd_name)  # e.g. its node was drained

    kube.wait_for(lambda: (kube.find("pods", etcd_name) or first)["metadata"]["uid"] != first["metadata"]["uid"],
                  timeout=30, what="a new etcd pod")
    assert pod_names(kube, job) == [f"{job}-node-0"], "losing the etcd pod must not touch the node pods"
