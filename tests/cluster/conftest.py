"""One real control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler) for the
whole cluster tier, started from the pinned binaries in .cluster/bin/ on free loopback ports; or,
with ``--kubeconfig PATH`` (or $DDPJOB_TEST_KUBECONFIG), the cluster that admin kubeconfig reaches,
where the tests that need the sandbox's own control plane are deselected (sandbox_only.py).

A missing binary fails the tier with the command that builds it: a skipped tier would read as
green on a machine that never ran it.
"""
from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddpjob_sandbox.client import ApiError, KubeClient
from ddpjob_sandbox.control_plane import (
    BUILD_COMMAND, DEFAULT_BIN_DIR, ControlPlane, missing_binaries, running_control_plane,
)
from ddpjob_sandbox.control_plane.external import ExternalCluster, external_cluster, require_admin
from ddpjob_sandbox.control_plane.kubelets import Kubelet, running_kubelets
from ddpjob_sandbox.control_plane.login import LoginError
from ddpjob_sandbox.control_plane.scripted_nodes import StatusOnlyNode, running_status_only_nodes
from tests.cluster import sandbox_only
from tests.cluster.installed_operator import Installed, installed_operator
from tests.cluster.operators import STATUS_ONLY_NODES, Operated, Releases, operated

KUBELET_NAMES = ("kubelet-0", "kubelet-1", "kubelet-2")
HEARTBEAT_SECONDS = 2.0
# A Node silent this long is lost (Unknown, tainted unreachable): 8 heartbeats of the kubelets
# below, so a loaded machine that delays a few does not lose a Node, and a test of a lost Node
# waits seconds, not the 40 s default.
NODE_MONITOR_GRACE_SECONDS = 16
# Every namespace a test makes carries it: on a cluster of one's own, `kubectl delete namespace -l
# ddpjob.io/cluster-test` removes what an interrupted run left.
TEST_NAMESPACE_LABEL = "ddpjob.io/cluster-test"
DESELECTED = pytest.StashKey[dict]()


def external_kubeconfig(config: pytest.Config) -> Path | None:
    """The admin kubeconfig of the cluster to test (tests/conftest.py's --kubeconfig), or None:
    the tier starts its own control plane."""
    value = config.getoption("kubeconfig")
    return Path(value) if value else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Against an external cluster, deselects the sandbox-only tests (pytest counts them in its last
    line; pytest_terminal_summary says why)."""
    if external_kubeconfig(config) is None:
        return
    kept, deselected = sandbox_only.split(items)
    running = set(kept)
    config.hook.pytest_deselected(items=[item for item in items if item not in running])
    items[:] = kept
    config.stash[DESELECTED] = deselected


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    if DESELECTED in config.stash:
        lines = sandbox_only.summary(str(external_kubeconfig(config)), config.stash[DESELECTED],
                                     verbose=config.option.verbose > 0)
        terminalreporter.section("sandbox-only tests")
        for line in lines:
            terminalreporter.write_line(line)


@contextlib.contextmanager
def _external(kubeconfig: Path) -> Iterator[ExternalCluster]:
    """The external cluster, its login checked before any test uses it."""
    try:
        with external_cluster(kubeconfig) as cluster:
            require_admin(cluster)
            yield cluster
    except LoginError as e:
        pytest.fail(f"--kubeconfig {kubeconfig}: {e}", pytrace=False)


@pytest.fixture(scope="session")
def control_plane(request: pytest.FixtureRequest, tmp_path_factory) -> Iterator[ControlPlane | ExternalCluster]:
    kubeconfig = external_kubeconfig(request.config)
    if kubeconfig is not None:
        with _external(kubeconfig) as cluster:
            yield cluster
        return
    missing = missing_binaries(DEFAULT_BIN_DIR)
    if missing:
        pytest.fail(f"the cluster tier needs {', '.join(missing)} in {DEFAULT_BIN_DIR}: build them with "
                    f"{BUILD_COMMAND}", pytrace=False)
    with running_control_plane(tmp_path_factory.mktemp("control-plane"),
                               node_monitor_grace_seconds=NODE_MONITOR_GRACE_SECONDS) as running:
        yield running


@pytest.fixture
def kube(control_plane: ControlPlane | ExternalCluster) -> Iterator[KubeClient]:
    """The admin's client in a fresh namespace of the real API server; on an external cluster the
    namespace, and what the test left in it, is deleted after the test."""
    client = control_plane.client(namespace=f"test-{uuid.uuid4().hex[:6]}")
    client.create("namespaces", {"metadata": {"name": client.namespace, "labels": {TEST_NAMESPACE_LABEL: "true"}}})
    # The ServiceAccount admission plugin refuses a pod until the controller manager has made
    # the namespace's `default` service account.
    client.wait_for(lambda: client.find("serviceaccounts", "default"), timeout=30,
                    what=f"the default service account of {client.namespace}")
    yield client
    if isinstance(control_plane, ExternalCluster):
        # The sandbox is thrown away whole at the end; someone else's cluster is not. Not waited
        # for: the namespace controller finishes it.
        with contextlib.suppress(ApiError):
            client.delete("namespaces", client.namespace)


@pytest.fixture(scope="session")
def kubelets(control_plane: ControlPlane, tmp_path_factory) -> Iterator[list[Kubelet]]:
    """Three Nodes whose kubelets (in this process, so a test reads their agents) run the pods bound
    to them; their Nodes carry control_plane.kubelets.NODE_LABEL."""
    root = tmp_path_factory.mktemp("kubelets")
    with running_kubelets(control_plane.layout.pki, control_plane.url, root, KUBELET_NAMES, heartbeat_seconds=HEARTBEAT_SECONDS,
                          poll_seconds=0.2) as running:
        yield running


@pytest.fixture(scope="module")
def installed(control_plane: ControlPlane, kubelets, tmp_path_factory) -> Iterator[Installed]:
    """The operator helm-installed in a `restricted` namespace of its own (installed_operator),
    once per test module: a module's tests share its install and leave it to the next."""
    with installed_operator(control_plane, kubelets, tmp_path_factory) as running:
        yield running


@pytest.fixture(scope="session")
def status_nodes(control_plane: ControlPlane) -> Iterator[list[StatusOnlyNode]]:
    """Nodes that run no process (status_nodes.py): a test writes the status of the pods bound to
    them. Registered by the admin; tainted, so only pods that tolerate it (operators.on_status_nodes)
    land there."""
    with running_status_only_nodes(control_plane.client(), STATUS_ONLY_NODES,
                                   heartbeat_seconds=HEARTBEAT_SECONDS) as running:
        yield running


@pytest.fixture(scope="session")
def operator_releases(control_plane: ControlPlane, kubelets, tmp_path_factory) -> Iterator[Releases]:
    """The chart helm-installed once per set of operator flags, for the whole session (operators.py)."""
    releases = Releases(control_plane, kubelets, tmp_path_factory)
    try:
        yield releases
    finally:
        releases.close()


@pytest.fixture
def operator(operator_releases: Releases, status_nodes, request: pytest.FixtureRequest) -> Iterator[Operated]:
    """The helm-installed operator of this test's flags (``@pytest.mark.operator_args(...)``) and
    chart values (``@pytest.mark.operator_values(key=value)``), its namespace and a job name of the
    test's own; the test's DDPJobs and their pods are gone after it."""
    marker = request.node.get_closest_marker("operator_args")
    values = request.node.get_closest_marker("operator_values")
    with operated(operator_releases, tuple(marker.args) if marker else (), values.kwargs if values else None) as running:
        yield running
