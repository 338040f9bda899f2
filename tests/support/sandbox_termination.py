"""Termination messages on the sandbox node: folded into tests.support.sandbox.

The plain :class:`tests.support.sandbox.NodeAgent` now does what the subclass here did (a
per-pod file behind ``terminationMessagePath``, copied into ``terminated.message`` on exit,
with the log's tail under ``FallbackToLogsOnError``). This module keeps the names tests
already import.
"""
from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddpjob_sandbox.client import KubeClient
from tests.support.sandbox import NodeAgent, running_node_agent

TerminationMessageNodeAgent = NodeAgent  # the old subclass's name


@pytest.fixture
def termination_node_agent(k8s: KubeClient, tmp_path: Path) -> Iterator[NodeAgent]:
    """The same as sandbox.node_agent (termination messages included), under its old name."""
    with running_node_agent(k8s, tmp_path / "node") as agent:
        yield agent
        sys.stdout.write(f"\n--- sandbox node containers ---\n{agent.logs()}\nnode agent API errors: {agent.errors}\n")
