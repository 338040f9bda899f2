"""Suite-wide test settings: the fixtures every test may use (tests/support/fixtures.py), the marker that skips with a reason where the
machine lacks a GPU, and the option that points the `cluster` tier at a cluster of one's own. The
`cluster` tier (tests/cluster/) is never skipped: it starts its own control plane and fails, naming
the build command, where the binaries are missing; with ``--kubeconfig`` it runs against that
cluster instead and deselects, with a summary line, what only the sandbox can run
(tests/cluster/sandbox_only.py)."""
import os

import pytest

from tests.support.fixtures import torch_only_env  # noqa: F401  (a fixture for every test)

KUBECONFIG_ENV = "DDPJOB_TEST_KUBECONFIG"
SERIAL_GROUP = "one-worker"


def pytest_addoption(parser):
    parser.addoption(
        "--kubeconfig", default=os.environ.get(KUBECONFIG_ENV) or None, metavar="PATH",
        help=f"run tests/cluster against the cluster of this admin kubeconfig's current context instead of "
             f"a control plane the tests start (default: ${KUBECONFIG_ENV}); tests that need the sandbox's "
             f"own control plane are deselected, with the reason in the summary")


# tryfirst: pytest-xdist's worker reads the xdist_group marks in its own modifyitems hook (it turns
# them into the node id's "@group" suffix that --dist loadgroup schedules by), and without this it
# ran before the marks below existed, so the cluster tier was split over both workers.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    for item in items:
        if item.get_closest_marker("gpu") and not has_gpu:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU; none is present"))
    # The cluster tier last: its session fixtures (the control plane, the kubelets, the helm-installed
    # operators) run until the session ends, and run before the torch tests they took CPU from every
    # one of them for the rest of the suite. A stable sort: each part keeps its order.
    items.sort(key=uses_the_cluster)
    # Under `make test`'s two pytest-xdist workers, the cluster tier and `ddpjob run`'s multi-node
    # runs go to one worker, one after another: the cluster tier's session fixtures exist once, and
    # the heaviest multi-process scenarios never run beside each other. The rest is spread over both.
    for item in items:
        if uses_the_cluster(item) or item.nodeid.startswith("tests/local/"):
            item.add_marker(pytest.mark.xdist_group(SERIAL_GROUP))


def uses_the_cluster(item) -> bool:
    return item.get_closest_marker("cluster") is not None or "control_plane" in getattr(item, "fixturenames", ())
