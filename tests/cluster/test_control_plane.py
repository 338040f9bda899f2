"""The control plane itself: the API server knows the admin by certificate, the controller manager
and the scheduler act on what is stored, every request is audited, and `down` leaves no process."""
from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from ddpjob_sandbox.client import KubeClient
from ddpjob_sandbox.control_plane import DEFAULT_BIN_DIR, REPO, ControlPlane
from ddpjob_sandbox.control_plane.kubelets import cluster_marker
from ddpjob_sandbox.node.launch import NODE_ENV
from ddpjob_sandbox.procs import marked_pids
from tests.cluster.sandbox_only import ADMIN_CERTIFICATE, AUDIT_LOG, OWN_CONTROL_PLANE

pytestmark = pytest.mark.cluster

WAIT = 60.0  # the controller manager's and the scheduler's reaction, on a busy 2-core machine
TEST_NODE_TAINT = {"key": "ddpjob.io/test-node", "effect": "NoSchedule"}


@pytest.mark.sandbox_only(ADMIN_CERTIFICATE)
def test_the_admin_is_known_by_its_certificate_as_a_member_of_system_masters(kube: KubeClient):
    review = kube.request("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                          {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
    assert review["status"]["userInfo"]["username"] == "ddpjob-admin"
    assert "system:masters" in review["status"]["userInfo"]["groups"]


@pytest.mark.sandbox_only(ADMIN_CERTIFICATE)
def test_kubectl_is_the_pinned_release(control_plane: ControlPlane):
    done = subprocess.run([str(control_plane.layout.bin_dir / "kubectl"), "version", "--client", "-o", "json"],
                          capture_output=True, text=True, timeout=30, check=True)
    assert json.loads(done.stdout)["clientVersion"]["gitVersion"] == "v1.37.2"


def test_the_garbage_collector_deletes_what_a_deleted_owner_owned(kube: KubeClient):
    owner = kube.create("configmaps", {"metadata": {"name": "owner"}})
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}
    kube.create("configmaps", {"metadata": {"name": "owned", "ownerReferences": [ref]}})
    kube.delete("configmaps", "owner")
    kube.wait_for(lambda: kube.find("configmaps", "owned") is None, timeout=WAIT,
                  what="the garbage collector deleting the owned ConfigMap")


def test_the_scheduler_binds_a_pod_to_a_ready_node(kube: KubeClient):
    node = f"node-{uuid.uuid4().hex[:6]}"
    # Tainted, and the pod tolerates it: on a cluster of one's own (--kubeconfig) no other pod is
    # placed on a Node that has no kubelet.
    kube.create("nodes", {"metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}},
                          "spec": {"taints": [TEST_NODE_TAINT]}})
    kube.patch("nodes", node, {"status": {
        "capacity": {"cpu": "4", "memory": "8Gi", "pods": "10"},
        "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "10"},
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "test"}]}},
        subresource="status")
    try:
        kube.create("pods", {"metadata": {"name": "bound"}, "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node}, "tolerations": [{**TEST_NODE_TAINT, "operator": "Exists"}],
            "containers": [{"name": "main", "image": "busybox"}]}})
        kube.wait_for(lambda: kube.get("pods", "bound")["spec"].get("nodeName"), timeout=WAIT,
                      what=f"the scheduler binding pod bound to {node}")
        assert kube.get("pods", "bound")["spec"]["nodeName"] == node
        # No kubelet confirms its end: removed at once, so its namespace can go too.
        kube.delete("pods", "bound", gracePeriodSeconds=0)
    finally:
        kube.delete("nodes", node)


@pytest.mark.sandbox_only(AUDIT_LOG)
def test_every_request_is_in_the_audit_log(control_plane: ControlPlane, kube: KubeClient):
    kube.create("configmaps", {"metadata": {"name": "audited"}})
    def audited():
        lines = control_plane.layout.audit_log.read_text().splitlines()
        return [e for e in map(json.loads, lines) if e.get("verb") == "create"
                and e.get("objectRef", {}).get("name") == "audited"
                and e.get("objectRef", {}).get("namespace") == kube.namespace]
    (event,) = kube.wait_for(audited, timeout=10, what="the create in the audit log")
    assert (event["user"]["username"], event["responseStatus"]["code"]) == ("ddpjob-admin", 201)


def component_pids(root: Path) -> list[int]:
    """Processes whose command line names ``root`` (every component's flags do)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if str(root).encode() in (proc / "cmdline").read_bytes():
                    pids.append(int(proc.name))
            except OSError:
                continue
    return pids


@pytest.mark.sandbox_only(OWN_CONTROL_PLANE)
def test_make_cluster_starts_ready_nodes_that_run_pods_and_down_leaves_no_process(tmp_path: Path):
    command = [sys.executable, "-m", "ddpjob_sandbox.control_plane"]
    env_args = ["--dir", str(tmp_path), "--bin-dir", str(DEFAULT_BIN_DIR)]
    kubectl = [str(DEFAULT_BIN_DIR / "kubectl"), "--kubeconfig", str(tmp_path / "kubeconfig")]
    up = subprocess.run([*command, "up", *env_args], capture_output=True, text=True, timeout=300,
                        cwd=REPO, env=_sandbox_env())
    pod_pids: list[int] = []
    try:
        assert up.returncode == 0, up.stderr
        assert len(component_pids(tmp_path)) == 5, "etcd, API server, controller manager, scheduler, kubelets"
        nodes = json.loads(subprocess.run([*kubectl, "get", "nodes", "-o", "json"], capture_output=True, text=True,
                                          timeout=30, check=True).stdout)["items"]
        ready = [n["metadata"]["name"] for n in nodes
                 if any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"]["conditions"])]
        assert len(ready) >= 3, "up returns only once three Nodes are Ready"
        subprocess.run([*kubectl, "apply", "-f", str(REPO / "manifests" / "examples" / "snapshot-pvc.yaml")],
                       capture_output=True, text=True, timeout=30, check=True)
        subprocess.run([*kubectl, "run", "sleeper", "--image=sandbox", "--restart=Never", "--command", "--",
                        "python", "-c", "import time; time.sleep(600)"], capture_output=True, text=True, timeout=30,
                       check=True)
        client = _admin(tmp_path)
        client.wait_for(lambda: client.get("persistentvolumeclaims", "mlp-snapshots")["status"].get("phase")
                        == "Bound", timeout=WAIT, what="the example claim bound to a hostPath volume")
        client.wait_for(lambda: client.get("pods", "sleeper")["status"].get("phase") == "Running", timeout=WAIT,
                        what="the sleeper pod running on a kubelet")
        pod_pids = [p for p in _marked(tmp_path) if p not in component_pids(tmp_path)]
        assert pod_pids, "the pod's process runs on this machine, marked as the cluster's"
    finally:
        down = subprocess.run([*command, "down", *env_args], capture_output=True, text=True, timeout=120,
                              cwd=REPO, env=_sandbox_env())
    assert down.returncode == 0, down.stderr
    assert component_pids(tmp_path) == []
    assert _marked(tmp_path) == [], "no kubelet or pod process survives cluster-down"
    assert down.stdout.strip() == "stopped: kubelets, kube-scheduler, kube-controller-manager, kube-apiserver, etcd"


def _marked(root: Path) -> list[int]:
    """Processes of the cluster's kubelets and pods (their SANDBOX_NODE marker)."""
    return marked_pids(cluster_marker(root), key=NODE_ENV, prefix=True)


def _admin(root: Path) -> KubeClient:
    """The admin's client of the cluster ``make cluster`` started in ``root``."""
    context = ssl.create_default_context(cafile=str(root / "pki" / "ca.crt"))
    context.load_cert_chain(str(root / "pki" / "admin.crt"), str(root / "pki" / "admin.key"))
    url = json.loads((root / "state.json").read_text())["apiserver"]
    return KubeClient(url, root / "kubeconfig", ssl_context=context)


def _sandbox_env() -> dict[str, str]:
    paths = [str(REPO / "sandbox"), str(REPO), *sys.path]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
