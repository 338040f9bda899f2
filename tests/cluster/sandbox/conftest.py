"""The sandbox's end-to-end tests on the real control plane: pods the real scheduler binds to the
kubelets' Nodes, run as local processes by their node agents (control_plane.kubelets)."""
from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from ddpjob_sandbox.client import KubeClient
from ddpjob_sandbox.control_plane.kubelets import Containers
from tests.cluster.operators import Operated
from tests.cluster.sandbox.scenarios import Sandbox


@pytest.fixture
def containers(kubelets, kube: KubeClient) -> Iterator[Containers]:
    """The containers of ``kube``'s namespace on every kubelet; their logs are printed after the
    test (shown when it fails)."""
    found = Containers(kubelets, kube)
    yield found
    sys.stdout.write(f"\n--- sandbox containers of {kube.namespace} ---\n{found.logs()}\n")


@pytest.fixture
def sandbox(operator: Operated, kubelets, control_plane, tmp_path) -> Iterator[Sandbox]:
    """A test of the shared operator (``operator``, with its ``@pytest.mark.operator_args``) in
    the sandbox: its namespace, its job name, the containers there, claims of its jobs' own."""
    held = Sandbox(operator, Containers(kubelets, operator.kube, prefix=operator.job), tmp_path, control_plane)
    try:
        yield held
    finally:
        sys.stdout.write(f"\n--- sandbox containers of {operator.kube.namespace} ---\n{held.nodes.logs()}\n")
        held.close()
