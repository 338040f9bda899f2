"""The whole one-machine cluster of ``make cluster``: the control plane, the kubelets of three
Nodes as one background process, and hostPath PersistentVolumes for the examples' claims.

:func:`up_cluster` returns once at least three Nodes are Ready (the kubelets registered and
posted status) and the volumes exist; :func:`down_cluster` stops every recorded process, then
kills whatever still carries the cluster's marker (a pod that outlived its kubelet's SIGTERM).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ddpjob_sandbox.client import ApiError, KubeClient
from ddpjob_sandbox.control_plane.components import Layout
from ddpjob_sandbox.control_plane.kubelets import DEFAULT_NODES, cluster_marker
from ddpjob_sandbox.control_plane.runner import Component, admin_client, down, launch, up
from ddpjob_sandbox.node.launch import NODE_ENV
from ddpjob_sandbox.procs import kill_marked_until_gone

MIN_READY_NODES = 3
KUBELETS_TIMEOUT_SECONDS = 60.0
# One volume per claim of manifests/examples/snapshot-pvc.yaml (each asks 1Gi ReadWriteMany,
# no storage class): the PV binder gives each claim one of these.
VOLUMES = 3
VOLUME_CAPACITY = "10Gi"


def ready_nodes(client: KubeClient) -> list[str]:
    """Names of the Nodes whose Ready condition is True."""
    return sorted(n["metadata"]["name"] for n in client.list("nodes")
                  if any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions") or []))


def kubelets_component(layout: Layout, names: tuple[str, ...] = DEFAULT_NODES) -> Component:
    """The kubelets' background process: healthy once every one of its Nodes is Ready."""
    admin = admin_client(layout)
    argv = [sys.executable, "-m", "ddpjob_sandbox.control_plane.kubelets", "--dir", str(layout.root),
            "--api-url", layout.apiserver_url, "--nodes", ",".join(names)]

    def healthy() -> bool:
        try:
            return set(names) <= set(ready_nodes(admin))
        except (ApiError, OSError):
            return False

    # The marker lets down_cluster find this process and every pod it started, whatever happens to it.
    return Component("kubelets", argv, healthy, KUBELETS_TIMEOUT_SECONDS,
                     env={**os.environ, NODE_ENV: f"{cluster_marker(layout.root)}/kubelets"})


def volume_body(name: str, path: Path, capacity: str = VOLUME_CAPACITY) -> dict:
    """A hostPath PersistentVolume without storage class: what a claim of the examples binds to."""
    return {"apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": name, "labels": {"ddpjob.io/sandbox-volume": "true"}},
            "spec": {"capacity": {"storage": capacity}, "accessModes": ["ReadWriteMany", "ReadWriteOnce"],
                     "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                     "hostPath": {"path": str(path), "type": "DirectoryOrCreate"}}}


def make_volumes(client: KubeClient, root: Path, count: int = VOLUMES, prefix: str = "sandbox-pv") -> list[str]:
    """Creates ``count`` hostPath volumes ``<prefix>-<i>`` under ``root`` (kept when they exist);
    returns their names."""
    names = []
    for i in range(count):
        name = f"{prefix}-{i}"
        path = root / name
        path.mkdir(parents=True, exist_ok=True)
        try:
            client.create("persistentvolumes", volume_body(name, path))
        except ApiError as e:
            if e.status != 409:
                raise
        names.append(name)
    return names


def up_cluster(layout: Layout, nodes: tuple[str, ...] = DEFAULT_NODES) -> dict[str, subprocess.Popen]:
    """The control plane, then the kubelets (until their Nodes are Ready), then the volumes.

    Raises:
        ControlPlaneError: a component exited or stayed unhealthy (everything started is stopped).
    """
    started = up(layout)
    try:
        launch(layout, kubelets_component(layout, nodes), started)
        make_volumes(admin_client(layout), layout.root / "volumes")
    except BaseException:
        down_cluster(layout.root)
        raise
    return started


def down_cluster(root: Path) -> tuple[list[str], list[int]]:
    """Stops every recorded process, then SIGKILLs whatever the kubelets left (their marker);
    returns the names stopped and the pids still alive after that (none, unless unkillable)."""
    stopped = down(root)
    left = kill_marked_until_gone(cluster_marker(root), key=NODE_ENV, prefix=True)
    return stopped, left
