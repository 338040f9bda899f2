"""pytest fixtures over ddpjob_sandbox, for every test (tests/conftest.py imports them).

``cluster`` (one API emulator per test), ``k8s`` (its client, in a fresh namespace),
``operator`` (the real operator watching that namespace) and ``node_agent`` (the sandbox
node running that namespace's pods as local processes). Each prints its log after the test,
shown when the test fails. ``torch_only_env`` is the environment of a plain PyTorch image
(torch, no ddpjob), made once per session.
"""
from __future__ import annotations

import pathlib
import sys
import uuid
from collections.abc import Iterator

import pytest

from ddpjob_sandbox.client import KubeClient
from ddpjob_sandbox.cluster import Cluster, running_cluster
from ddpjob_sandbox.images import torch_only_env as make_torch_only_env
from ddpjob_sandbox.node import NodeAgent, running_node_agent
from ddpjob_sandbox.operator_process import OperatorProcess, operator_command


@pytest.fixture
def cluster(tmp_path: pathlib.Path) -> Iterator[Cluster]:
    """A fresh API emulator with the DDPJob CRD, served on loopback for this test."""
    with running_cluster(tmp_path) as running:
        yield running


@pytest.fixture
def k8s(cluster: Cluster) -> KubeClient:
    """A client bound to a fresh namespace of a fresh emulator."""
    return cluster.client(namespace=f"test-{uuid.uuid4().hex[:6]}")


@pytest.fixture
def operator(cluster: Cluster, k8s: KubeClient, tmp_path: pathlib.Path,
             request: pytest.FixtureRequest) -> Iterator[OperatorProcess]:
    """The real operator (``python -m ddpjob_operator``) watching ``k8s.namespace``;
    ``@pytest.mark.operator_args("--flag", "value")`` adds flags.

    Its log is printed (shown when the test fails), and an unexpected exception in it (a
    traceback) fails the test even when the cluster ended up as expected.
    """
    marker = request.node.get_closest_marker("operator_args")
    extra = marker.args if marker else ()
    process = OperatorProcess(cluster, operator_command(k8s.namespace, *extra), tmp_path / "operator.log")
    with process:
        yield process
    log = process.log()
    sys.stdout.write(f"\n--- operator log ({process.log_path}) ---\n{log[-20000:]}\n")
    assert "Traceback" not in log, f"the operator raised an unexpected exception:\n{log[-5000:]}"


@pytest.fixture
def node_agent(k8s: KubeClient, tmp_path: pathlib.Path) -> Iterator[NodeAgent]:
    """A node agent running the pods of ``k8s.namespace``; its container logs are printed after the test."""
    with running_node_agent(k8s, tmp_path / "node") as agent:
        yield agent
        sys.stdout.write(f"\n--- sandbox node containers ---\n{agent.logs()}\nnode agent API errors: {agent.errors}\n")


@pytest.fixture(scope="session")
def torch_only_env(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A Python environment with torch and every other package of this one, but no ddpjob
    distribution (ddpjob_sandbox.images): what a plain PyTorch image holds."""
    return make_torch_only_env(tmp_path_factory.mktemp("images") / "torch-only")
