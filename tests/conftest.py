"""Suite-wide test settings: the sandbox fixtures, and markers that skip with a reason where the machine
lacks a GPU or cluster."""
import os
import shutil

import pytest

from tests.support.fixtures import cluster, k8s, node_agent, operator  # noqa: F401  (fixtures for every test)


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    has_cluster = bool(os.environ.get("DDPJOB_TEST_KUBECONFIG")) and shutil.which("kubectl")
    for item in items:
        if "gpu" in item.keywords and not has_gpu:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU; none is present"))
        if "cluster" in item.keywords and not has_cluster:
            item.add_marker(pytest.mark.skip(reason="needs a real cluster: set DDPJOB_TEST_KUBECONFIG"))
