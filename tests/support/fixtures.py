"""pytest fixtures over ddpjob_sandbox for tests anywhere in the suite (tests/conftest.py imports them).

``torch_only_env`` is the environment of a plain PyTorch image (torch, no ddpjob), made once per
session: the trainer's tests run the store server in it, the cluster tier maps an image to it.
The fixtures of the real control plane (its client, kubelets, Nodes, the helm-installed operator)
are the cluster tier's own, in tests/cluster/conftest.py.
"""
from __future__ import annotations

import pathlib

import pytest

from ddpjob_sandbox.images import torch_only_env as make_torch_only_env


@pytest.fixture(scope="session")
def torch_only_env(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A Python environment with torch and every other package of this one, but no ddpjob
    distribution (ddpjob_sandbox.images): what a plain PyTorch image holds."""
    return make_torch_only_env(tmp_path_factory.mktemp("images") / "torch-only")
