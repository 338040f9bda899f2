"""One real control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler) for the
whole cluster tier, started from the pinned binaries in .cluster/bin/ on free loopback ports.

A missing binary fails the tier with the command that builds it: a skipped tier would read as
green on a machine that never ran it.
"""
from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from ddpjob_sandbox.client import KubeClient
from ddpjob_sandbox.control_plane import (
    BUILD_COMMAND, DEFAULT_BIN_DIR, ControlPlane, missing_binaries, running_control_plane,
)


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory) -> Iterator[ControlPlane]:
    missing = missing_binaries(DEFAULT_BIN_DIR)
    if missing:
        pytest.fail(f"the cluster tier needs {', '.join(missing)} in {DEFAULT_BIN_DIR}: build them with "
                    f"{BUILD_COMMAND}", pytrace=False)
    with running_control_plane(tmp_path_factory.mktemp("control-plane")) as running:
        yield running


@pytest.fixture
def kube(control_plane: ControlPlane) -> KubeClient:
    """The admin's client in a fresh namespace of the real API server."""
    client = control_plane.client(namespace=f"test-{uuid.uuid4().hex[:6]}")
    client.create("namespaces", {"metadata": {"name": client.namespace}})
    # The ServiceAccount admission plugin refuses a pod until the controller manager has made
    # the namespace's `default` service account.
    client.wait_for(lambda: client.find("serviceaccounts", "default"), timeout=30,
                    what=f"the default service account of {client.namespace}")
    return client
