"""The sandbox node with the kubelet's termination messages (a subclass, sandbox.py unchanged).

A kubelet creates the file at the container's ``terminationMessagePath`` before the container
starts and copies it into ``state.terminated.message`` when the container exits. The sandbox
has no mount namespace, so each pod gets its own file under its pod directory, and env values
naming the path point there instead (as sandbox.py does for volume mounts).
"""
from __future__ import annotations

import contextlib
import copy
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.operator_harness import KubeClient
from tests.support.sandbox import NodeAgent, pod_dir

DEFAULT_PATH = "/dev/termination-log"
MESSAGE_LIMIT = 4096  # the kubelet keeps at most 4096 bytes per container


class TerminationMessageNodeAgent(NodeAgent):
    """NodeAgent that honours terminationMessagePath."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.message_files: dict[str, Path] = {}  # pod uid -> its termination message file

    def _start(self, pod: dict) -> None:
        container = pod["spec"]["containers"][0]
        path = container.get("terminationMessagePath", DEFAULT_PATH)
        local = pod_dir(self.root, pod["metadata"]) / "termination-log"
        local.parent.mkdir(parents=True, exist_ok=True)
        local.touch()
        self.message_files[pod["metadata"]["uid"]] = local
        pod = copy.deepcopy(pod)
        for entry in pod["spec"]["containers"][0].get("env") or []:
            if entry.get("value") == path:
                entry["value"] = str(local)
        super()._start(pod)

    def _patch_status(self, name: str, body: dict, uid: str | None = None) -> None:
        for status in (body.get("status") or {}).get("containerStatuses") or []:
            terminated = (status.get("state") or {}).get("terminated")
            path = self.message_files.get(uid or "")
            if terminated is not None and path is not None and path.exists():
                message = path.read_bytes()[:MESSAGE_LIMIT].decode(errors="replace").strip()
                if message:
                    terminated["message"] = message
        super()._patch_status(name, body, uid)


@pytest.fixture
def termination_node_agent(k8s: KubeClient, tmp_path: Path) -> Iterator[TerminationMessageNodeAgent]:
    """Like sandbox.node_agent, with termination messages."""
    agent = TerminationMessageNodeAgent(k8s, tmp_path / "node")
    with agent:
        yield agent
        sys.stdout.write(f"\n--- sandbox node containers ---\n{agent.logs()}\nnode agent API errors: {agent.errors}\n")
