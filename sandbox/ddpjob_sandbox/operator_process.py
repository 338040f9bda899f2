"""The real operator (or any kopf module) as a subprocess logged in to a cluster: the real
control plane (control_plane.ControlPlane, as its admin) or the emulator (cluster.Cluster).

It runs in its own process group with the cluster's kubeconfig, the way it runs against a
real cluster; stopping it stops the whole group, and :meth:`OperatorProcess.kill` plays a
crash with no chance to clean up.
"""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys
from collections.abc import Mapping
from typing import Any, Protocol

from ddpjob_sandbox.cluster import REPO
from ddpjob_sandbox.procs import start_in_own_group, stop_process_group


class LoggedIn(Protocol):
    """Anything with a kubeconfig to log in with: ControlPlane (the admin's), the emulator's Cluster."""

    @property
    def kubeconfig(self) -> pathlib.Path: ...


class OperatorProcess:
    """The operator as a subprocess in its own process group, logging to ``log_path``."""

    def __init__(self, cluster: LoggedIn, args: list[str], log_path: pathlib.Path, env: Mapping[str, str] | None = None):
        self.cluster = cluster
        self.args = args
        self.log_path = log_path
        self.env = dict(env or {})
        self.process: subprocess.Popen | None = None

    def start(self) -> "OperatorProcess":
        env = dict(os.environ, KUBECONFIG=str(self.cluster.kubeconfig), PYTHONUNBUFFERED="1", **self.env)
        log = open(self.log_path, "ab")
        self.process = start_in_own_group(self.args, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        log.close()
        return self

    def stop(self, grace: float = 5.0) -> None:
        if self.process is not None:
            stop_process_group(self.process, grace=grace)

    def kill(self) -> None:
        """SIGKILL: the operator dies mid-work, with no chance to clean up."""
        if self.process is not None:
            stop_process_group(self.process, grace=0)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def __enter__(self) -> "OperatorProcess":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def operator_command(namespace: str, *extra: str) -> list[str]:
    """The project's operator entry point, watching one namespace, standalone, no HTTP ports."""
    return [sys.executable, "-m", "ddpjob_operator", "--namespace", namespace, "--standalone",
            "--liveness-port", "0", "--metrics-port", "0", *extra]


def kopf_command(namespace: str, module_path: pathlib.Path) -> list[str]:
    """``kopf run`` of an arbitrary handlers file (used to test the harness itself)."""
    return [sys.executable, "-m", "kopf", "run", "--standalone", "--namespace", namespace, str(module_path)]
