"""Suite-wide test settings: the fixtures every test may use (tests/support/fixtures.py), and the
marker that skips with a reason where the machine lacks a GPU. The `cluster` tier (tests/cluster/)
is never skipped: it starts its own control plane and fails, naming the build command, where the
binaries are missing."""
import pytest

from tests.support.fixtures import torch_only_env  # noqa: F401  (a fixture for every test)


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    for item in items:
        if item.get_closest_marker("gpu") and not has_gpu:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU; none is present"))
