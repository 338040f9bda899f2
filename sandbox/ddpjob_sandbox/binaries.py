"""Where the servers the sandbox starts come from: the pinned builds in .cluster/bin/, and Debian's etcd 3.4.

``make cluster-binaries`` (scripts/cluster/build-binaries.py) builds etcd 3.6, etcdctl and the
control plane's binaries at pinned releases and links them into .cluster/bin/; a missing one
fails with that command, never a skip. etcd 3.6 is what ddpjob's etcd-v3 rendezvous is pitched
for (the v2 API is gone there). Debian's etcd 3.4 (scripts/install-system-deps.sh) stays for
one use only: torch's own ``etcd`` rendezvous backend speaks the v2 API, which 3.4 still serves
with ``--enable-v2``.
"""
from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# DDPJOB_CLUSTER_BIN points the sandbox (and the cluster test tier) at other builds, e.g. an older
# Kubernetes release built with `build-binaries.py --kubernetes-version ... --link DIR`.
DEFAULT_BIN_DIR = Path(os.environ.get("DDPJOB_CLUSTER_BIN") or REPO / ".cluster" / "bin")
BUILD_COMMAND = "make cluster-binaries  (scripts/cluster/build-binaries.py)"
DEBIAN_BIN_DIR = Path("/usr/bin")  # Debian's etcd-server and etcd-client install here
DEBIAN_INSTALL_COMMAND = "scripts/install-system-deps.sh  (Debian's etcd-server and etcd-client)"


class MissingBinaryError(RuntimeError):
    """A program the sandbox needs is not there; the message names the command that provides it."""


def pinned(name: str, bin_dir: Path = DEFAULT_BIN_DIR) -> Path:
    """The pinned build of ``name`` in ``bin_dir``.

    Raises:
        MissingBinaryError: it is missing or not executable (the message says how to build it).
    """
    path = Path(bin_dir) / name
    if not os.access(path, os.X_OK):
        raise MissingBinaryError(f"{name} not found in {bin_dir}: build it with {BUILD_COMMAND}")
    return path


def debian(name: str) -> Path:
    """Debian's ``name`` (etcd 3.4 and its etcdctl), for torch's v2 etcd backend only.

    Raises:
        MissingBinaryError: not installed (the message says how to install it).
    """
    path = DEBIAN_BIN_DIR / name
    if not os.access(path, os.X_OK):
        raise MissingBinaryError(f"{name} not found in {DEBIAN_BIN_DIR}: install it with {DEBIAN_INSTALL_COMMAND}")
    return path
