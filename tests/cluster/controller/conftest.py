"""The controller's I/O (controller/kube.py, controller/cache.py, the progress poller) against the
real API server, logged in as the admin: these tests prove what the controller sends and how it
reads the answers, not what the chart's RBAC allows (tests/cluster/e2e/test_operator_rbac.py does that)."""
from __future__ import annotations

from collections.abc import Callable

import kopf
import pytest

from ddpjob_operator.api import constants as C
from ddpjob_operator.controller import kube as controller_kube
from ddpjob_sandbox.control_plane import ControlPlane, audit
from ddpjob_sandbox.control_plane.external import ExternalCluster
from tests.cluster.crds import chart_crd, install_crd


@pytest.fixture(scope="session")
def ddpjob_crd(control_plane: ControlPlane) -> dict:
    """The chart's CRD, installed and served (the DDPJob verbs and the job watch need it)."""
    return install_crd(control_plane.client(), chart_crd())


@pytest.fixture
def admin_login(control_plane: ControlPlane | ExternalCluster) -> kopf.ConnectionInfo:
    """What kube.login would return for the admin's kubeconfig (the sandbox admin's CA and client
    certificate, or however an external cluster's kubeconfig logs in), so controller_kube.Kube talks
    TLS to the real server."""
    login = control_plane.login()
    return kopf.ConnectionInfo(
        server=login.server, ca_path=str(login.ca_file) if login.ca_file else None, insecure=login.insecure or None,
        certificate_path=str(login.certificate_file) if login.certificate_file else None,
        private_key_path=str(login.key_file) if login.key_file else None, token=login.token())


@pytest.fixture
def connect(admin_login: kopf.ConnectionInfo):
    """A fresh controller client per call (each asyncio.run needs its own session)."""
    return lambda: controller_kube.Kube(admin_login)


@pytest.fixture
def controller_requests(control_plane: ControlPlane, kube) -> Callable[[], list[audit.Request]]:
    """The requests controller_kube.Kube sent (its user agent) in ``kube``'s namespace since the
    test began, read from the API server's audit log: what the emulator's request log told."""
    log = control_plane.layout.audit_log
    start = audit.mark(log)

    def found() -> list[audit.Request]:
        return [r for r in audit.requests(log, start)
                if r.namespace == kube.namespace and r.user_agent.startswith(f"{C.MANAGED_BY}/")]
    return found

