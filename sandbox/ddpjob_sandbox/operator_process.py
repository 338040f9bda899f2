"""The real operator as a local subprocess logged in to the real control plane: as its admin
(control_plane.ControlPlane; the tests of its flags and ports) or under a ServiceAccount's token
(the benchmarks' chart operator). The e2e tests run the chart's, in a pod (tests/cluster/operators.py).

It runs in its own process group with the cluster's kubeconfig, the way it runs against a
real cluster; stopping it stops the whole group.
"""
from __future__ import annotations

import os
import pathlib
import subprocess
from collections.abc import Mapping
from typing import Any, Protocol

from ddpjob_sandbox.binaries import REPO
from ddpjob_sandbox.procs import start_in_own_group, stop_process_group


class LoggedIn(Protocol):
    """Anything with a kubeconfig to log in with: ControlPlane (the admin's), a bench's login."""

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

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def __enter__(self) -> "OperatorProcess":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

