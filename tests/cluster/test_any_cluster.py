"""The cluster tier pointed at a cluster it did not start (``pytest --kubeconfig PATH``), as a
platform team runs it against their own: here that cluster is the session's control plane, reached
only through a kubeconfig a platform team could hand out: the CA embedded, the user a
ServiceAccount bound to cluster-admin whose token an exec plugin prints (how EKS, GKE and AKS
log users in).

A pytest of its own runs a few modules with that kubeconfig: what a kubeconfig can reach passes,
and every test that needs the sandbox's own control plane (its PKI, audit log, kubelets, a control
plane of its own, the helm-installed operator running on the kubelets) is deselected and named
in the summary, never skipped in silence. A few modules only: it must not run a second suite.
A kubeconfig whose user is not a cluster admin is refused before any test runs, saying why.
"""
from __future__ import annotations

import base64
import os
import re
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
import yaml

from ddpjob_sandbox.client import KubeClient
from ddpjob_sandbox.control_plane import REPO
from ddpjob_sandbox.control_plane.external import external_cluster, require_admin
from ddpjob_sandbox.control_plane.login import LoginError
from tests.cluster.conftest import TEST_NAMESPACE_LABEL
from tests.cluster.sandbox_only import ADMIN_CERTIFICATE, AUDIT_LOG, KUBELETS, OWN_CONTROL_PLANE
from tests.conftest import KUBECONFIG_ENV

pytestmark = pytest.mark.cluster

# What runs against the kubeconfig: a module of each kind (control plane, CRD through kubectl,
# the controller's client logged in by token), and two whose tests are all sandbox-only.
MODULES = ("tests/cluster/test_control_plane.py", "tests/cluster/test_job_size_on_apiserver.py",
           "tests/cluster/controller/test_kube_verbs.py", "tests/cluster/test_kubelet.py",
           "tests/cluster/e2e/test_operator_scaling.py")
PASS_ANYWHERE = ("test_control_plane.py::test_the_garbage_collector_deletes_what_a_deleted_owner_owned",
                 "test_control_plane.py::test_the_scheduler_binds_a_pod_to_a_ready_node",
                 "test_job_size_on_apiserver.py::test_the_scale_subresource_itself_refuses_with_422_and_the_rule",
                 "test_kube_verbs.py::test_status_patch_writes_only_the_status_and_skips_a_deleted_job")
SANDBOX_ONLY = {
    "test_control_plane.py::test_the_admin_is_known_by_its_certificate_as_a_member_of_system_masters": ADMIN_CERTIFICATE,
    "test_control_plane.py::test_every_request_is_in_the_audit_log": AUDIT_LOG,
    "test_control_plane.py::test_make_cluster_starts_ready_nodes_that_run_pods_and_down_leaves_no_process":
        OWN_CONTROL_PLANE,
    "test_kubelet.py::test_a_never_pod_is_not_restarted": KUBELETS,
    "test_operator_scaling.py::": KUBELETS,  # every test of the module: the operator's pod runs on the kubelets
}
RUN_SECONDS = 420  # the subset on a loaded 2-core machine: pytest's start, the CRD's install, a few waits
TOKEN_SECONDS = 3600

# An exec plugin as kubectl and the test client run it: it reads the token from a file beside it
# and refuses to run without the KUBERNETES_EXEC_INFO that client.authentication.k8s.io/v1 requires.
PLUGIN = textwrap.dedent("""\
    import json, os, pathlib, sys
    if "KUBERNETES_EXEC_INFO" not in os.environ:
        sys.exit("KUBERNETES_EXEC_INFO is not set")
    token = (pathlib.Path(sys.argv[0]).parent / "token").read_text()
    print(json.dumps({"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
                      "status": {"token": token}}))
""")


def service_account_token(kube: KubeClient, account: str) -> str:
    """A token of ServiceAccount ``account`` of ``kube``'s namespace (the TokenRequest API, what
    `kubectl create token` calls)."""
    path = kube.path("serviceaccounts", account, subresource="token")
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
               "spec": {"expirationSeconds": TOKEN_SECONDS}}
    return kube.request("POST", path, request)["status"]["token"]


def platform_kubeconfig(control_plane, token: str, folder: Path) -> Path:
    """A kubeconfig for ``control_plane``'s API server: its CA embedded (or its own insecure flag),
    the user logged in by the exec plugin that prints ``token``."""
    login = control_plane.login()
    (folder / "token").write_text(token)
    (folder / "plugin.py").write_text(PLUGIN)
    cluster = {"server": login.server}
    if login.ca_file:
        cluster["certificate-authority-data"] = base64.b64encode(login.ca_file.read_bytes()).decode()
    if login.insecure:
        cluster["insecure-skip-tls-verify"] = True
    user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": sys.executable,
                     "args": [str(folder / "plugin.py")], "interactiveMode": "Never"}}
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "platform",
              "clusters": [{"name": "theirs", "cluster": cluster}], "users": [{"name": "platform-admin", "user": user}],
              "contexts": [{"name": "platform", "context": {"cluster": "theirs", "user": "platform-admin"}}]}
    path = folder / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


@pytest.fixture
def cluster_admin(kube: KubeClient):
    """ServiceAccount ``platform-admin`` of ``kube``'s namespace bound to cluster-admin; the binding
    is removed after the test."""
    kube.create("serviceaccounts", {"metadata": {"name": "platform-admin"}})
    binding = f"ddpjob-test-{kube.namespace}-{uuid.uuid4().hex[:4]}"
    bindings = "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings"
    kube.request("POST", bindings, {
        "metadata": {"name": binding},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": "platform-admin", "namespace": kube.namespace}]})
    try:
        yield service_account_token(kube, "platform-admin")
    finally:
        kube.request("DELETE", f"{bindings}/{binding}")


def run_against(kubeconfig: Path, basetemp: Path) -> subprocess.CompletedProcess:
    """A pytest of its own over MODULES with ``--kubeconfig``; its temporary files under ``basetemp``,
    apart from this session's."""
    env = {k: v for k, v in os.environ.items() if k != KUBECONFIG_ENV}
    try:
        return subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", f"--basetemp={basetemp}",
                               "--kubeconfig", str(kubeconfig), *MODULES], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=RUN_SECONDS)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else e.stdout or ""
        pytest.fail(f"the run against {kubeconfig} took over {RUN_SECONDS} s; it printed:\n{out[-6000:]}")


def labelled_namespaces(admin: KubeClient) -> dict[str, bool]:
    """The namespaces the cluster tests made (TEST_NAMESPACE_LABEL), each with whether it is being deleted."""
    return {ns["metadata"]["name"]: "deletionTimestamp" in ns["metadata"]
            for ns in admin.list("namespaces", label_selector=TEST_NAMESPACE_LABEL)}


def deselected_by_reason(output: str) -> dict[str, list[str]]:
    """The summary's section of sandbox-only tests: the node ids listed under each reason."""
    section = output.split("sandbox-only tests")[-1]
    by_reason, current = {}, None
    for line in section.splitlines():
        if re.match(r"^  \d+ ", line):
            current = line.split(" ", 3)[3]
            by_reason[current] = []
        elif line.startswith("    ") and current:
            by_reason[current].append(line.strip())
    return by_reason


@pytest.mark.timeout(RUN_SECONDS + 120)  # the session's control plane may start in setup
def test_a_kubeconfig_runs_what_it_reaches_and_deselects_the_sandbox_only_tests_naming_why(
        control_plane, kube: KubeClient, cluster_admin: str, tmp_path: Path):
    kubeconfig = platform_kubeconfig(control_plane, cluster_admin, tmp_path)
    before = labelled_namespaces(control_plane.client())
    done = run_against(kubeconfig, tmp_path / "run")
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    assert kube.namespace in before, "every test's namespace carries the label"
    left = [name for name, deleting in labelled_namespaces(control_plane.client()).items()
            if name not in before and not deleting]
    assert not left, f"each test's namespace is deleted after it on a cluster of one's own: {left} are not"
    for test in PASS_ANYWHERE:
        assert re.search(rf"{re.escape(test)} PASSED", output), f"{test} did not pass:\n{output[-6000:]}"

    (total,) = re.findall(r"against the cluster of .*: (\d+) sandbox-only tests deselected", output)
    (final,) = re.findall(r"(\d+) passed, (\d+) deselected", output)
    assert total == final[1], "the summary counts what pytest deselected"
    by_reason = deselected_by_reason(output)
    assert sum(map(len, by_reason.values())) == int(total)
    for test, why in SANDBOX_ONLY.items():
        assert any(test in nodeid for nodeid in by_reason.get(why, [])), f"{test} not deselected for {why}:\n{output}"
    deselected = {nodeid for ids in by_reason.values() for nodeid in ids}
    assert not [t for t in PASS_ANYWHERE if any(t in nodeid for nodeid in deselected)], "ran anywhere, yet deselected"
    assert "skipped" not in output.splitlines()[-1], "nothing is skipped: what cannot run is deselected, by reason"


def test_a_kubeconfig_whose_user_is_not_a_cluster_admin_is_refused_before_any_test_naming_why(
        control_plane, kube: KubeClient, tmp_path: Path):
    kube.create("serviceaccounts", {"metadata": {"name": "viewer"}})
    kubeconfig = platform_kubeconfig(control_plane, service_account_token(kube, "viewer"), tmp_path)
    with external_cluster(kubeconfig) as cluster, pytest.raises(LoginError) as refused:
        require_admin(cluster)
    assert str(refused.value).startswith(f"{kubeconfig}: its user may not do verb * on every resource of "
                                         f"{control_plane.url} ")
    assert str(refused.value).endswith("the cluster tests create namespaces, CRDs and Nodes: use a cluster-admin login")
