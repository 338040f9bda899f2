"""The operator's command line (`python -m ddpjob_operator`) run as a process logged in as the
admin to a real control plane: /healthz and /metrics count a job by phase and restart budget,
and --namespace (none, exact, a pattern) decides which namespaces it serves, new ones included.

A control plane of this module's own, with no Nodes (pods stay unbound; the test writes their
status): an operator serving every namespace would otherwise take up the DDPJobs other tests of
the session left in theirs, and the scheduler would run their pods on the session's kubelets.
(The flag parsing itself: tests/operator/controller/test_operator_cli.py.)"""
from __future__ import annotations

import sys
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ddpjob_sandbox.client import KubeClient
from ddpjob_sandbox.control_plane import ControlPlane, running_control_plane
from ddpjob_sandbox.jobs import make_manifest
from ddpjob_sandbox.operator_process import OperatorProcess
from ddpjob_sandbox.procs import free_port
from ddpjob_sandbox.readers import pod_names, status
from ddpjob_sandbox.scripted import set_terminated
from tests.cluster.crds import chart_crd, install_crd
from tests.cluster.sandbox_only import OWN_CONTROL_PLANE

pytestmark = pytest.mark.sandbox_only(OWN_CONTROL_PLANE)
OPERATOR = [sys.executable, "-m", "ddpjob_operator"]
SERVE_SECONDS = 60  # kopf's start-up and first list on a loaded 2-core machine, then one pass


@pytest.fixture(scope="module")
def own_plane(tmp_path_factory) -> Iterator[ControlPlane]:
    with running_control_plane(tmp_path_factory.mktemp("control-plane")) as plane:
        install_crd(plane.client(), chart_crd())
        yield plane


@pytest.fixture
def prefix() -> str:
    """This test's namespace prefix: the module's tests share one control plane."""
    return f"t{uuid.uuid4().hex[:6]}"


def namespace(plane: ControlPlane, name: str) -> KubeClient:
    client = plane.client(namespace=name)
    client.create("namespaces", {"metadata": {"name": name}})
    client.wait_for(lambda: client.find("serviceaccounts", "default"), timeout=30,
                    what=f"the default service account of {name}")
    return client


def fetch(url: str) -> tuple[int, str] | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except OSError:
        return None


def sample(text: str, series: str, **labels: str) -> float | None:
    """The value of one series in Prometheus' text format (None when absent)."""
    return next((s.value for family in text_string_to_metric_families(text) for s in family.samples
                 if s.name == series and s.labels == labels), None)


def test_healthz_and_metrics_are_served_and_count_jobs_by_phase_and_restart_budget(own_plane, prefix, tmp_path: Path):
    kube = namespace(own_plane, f"{prefix}-ns")
    liveness, metrics = free_port(), free_port()
    command = [*OPERATOR, "--namespace", kube.namespace, "--liveness-port", str(liveness),
               "--metrics-port", str(metrics)]
    with OperatorProcess(own_plane, command, tmp_path / "operator.log") as process:
        kube.create("ddpjobs", make_manifest(replicas=2))
        kube.wait_for(lambda: len(pod_names(kube)) == 2, timeout=SERVE_SECONDS, what="two node pods")
        set_terminated(kube, "mlp-node-1", 1)
        kube.wait_for(lambda: status(kube).get("restarts") == 1, timeout=30, what="a counted failure")
        assert kube.wait_for(lambda: fetch(f"http://127.0.0.1:{liveness}/healthz"), what="/healthz")[0] == 200
        text = kube.wait_for(lambda: (got := fetch(f"http://127.0.0.1:{metrics}/metrics"))
                             and 'ddpjob_operator_jobs{phase="Restarting"} 1.0' in got[1] and got[1],
                             timeout=30, what="the Restarting job in /metrics")
        assert "ddpjob_operator_pod_replacements_total 1.0" in text
        assert "ddpjob_operator_reconcile_seconds_count" in text
        # The budget from the job's status: no snapshot yet, so the failure is charged (1 of maxRestarts 3).
        job = {"namespace": kube.namespace, "name": "mlp"}
        assert sample(text, "ddpjob_operator_restart_budget_used", **job, budget="maxRestarts") == 1
        assert sample(text, "ddpjob_operator_restart_budget_limit", **job, budget="maxRestarts") == 3
        assert sample(text, "ddpjob_operator_job_phase", **job, phase="Restarting") == 1
    log = process.log()
    assert "Traceback" not in log
    assert "Handler 'job_changed' succeeded" in log


def test_without_namespaces_the_operator_serves_every_namespace(own_plane, prefix, tmp_path: Path):
    command = [*OPERATOR, "--liveness-port", "0", "--metrics-port", "0"]
    team_a, team_b = namespace(own_plane, f"{prefix}-team-a"), namespace(own_plane, f"{prefix}-team-b")
    with OperatorProcess(own_plane, command, tmp_path / "operator.log") as process:
        team_a.create("ddpjobs", make_manifest("a", replicas=1))
        team_b.create("ddpjobs", make_manifest("b", replicas=2))
        team_a.wait_for(lambda: pod_names(team_a, "a") == ["a-node-0"], timeout=SERVE_SECONDS, what="team-a's pod")
        team_b.wait_for(lambda: pod_names(team_b, "b") == ["b-node-0", "b-node-1"], timeout=SERVE_SECONDS,
                        what="team-b's pods")
    assert "Traceback" not in process.log()


def test_a_namespace_pattern_serves_matching_namespaces_even_new_ones(own_plane, prefix, tmp_path: Path):
    command = [*OPERATOR, "-n", f"{prefix}-team-*", "--liveness-port", "0", "--metrics-port", "0"]
    team_a, other = namespace(own_plane, f"{prefix}-team-a"), namespace(own_plane, f"{prefix}-other")
    team_a.create("ddpjobs", make_manifest("a", replicas=1))  # exists before the operator starts
    with OperatorProcess(own_plane, command, tmp_path / "operator.log") as process:
        team_a.wait_for(lambda: pod_names(team_a, "a") == ["a-node-0"], timeout=SERVE_SECONDS, what="team-a's pod")
        other.create("ddpjobs", make_manifest("o", replicas=1))
        team_b = namespace(own_plane, f"{prefix}-team-b")  # a namespace created while the operator runs
        team_b.create("ddpjobs", make_manifest("b", replicas=1))
        team_b.wait_for(lambda: pod_names(team_b, "b") == ["b-node-0"], timeout=SERVE_SECONDS, what="team-b's pod")
        assert pod_names(other, "o") == [], "a namespace outside the pattern is not served"
    assert "Traceback" not in process.log()


def test_two_operators_on_one_network_serve_healthz_and_metrics_each_on_its_listen_address(own_plane, prefix,
                                                                                          tmp_path: Path):
    """Pods that share a host's network (the sandbox's kubelets; DDPJOB_LISTEN_HOST is each pod's
    own address) must not collide on the chart's one livenessPort: each binds its address only."""
    team = namespace(own_plane, f"{prefix}-a")
    liveness, metrics = free_port(), free_port()
    command = [*OPERATOR, "--namespace", team.namespace, "--liveness-port", str(liveness), "--metrics-port", str(metrics)]
    with OperatorProcess(own_plane, command, tmp_path / "a.log", env={"DDPJOB_LISTEN_HOST": "127.0.7.1"}), \
            OperatorProcess(own_plane, command, tmp_path / "b.log", env={"DDPJOB_LISTEN_HOST": "127.0.7.2"}):
        for host in ("127.0.7.1", "127.0.7.2"):
            assert team.wait_for(lambda: fetch(f"http://{host}:{liveness}/healthz"), timeout=SERVE_SECONDS,
                                 what=f"/healthz on {host}")[0] == 200
            assert team.wait_for(lambda: fetch(f"http://{host}:{metrics}/metrics"), timeout=SERVE_SECONDS,
                                 what=f"/metrics on {host}")[0] == 200
        assert fetch(f"http://127.0.0.1:{liveness}/healthz") is None, "bound every interface"
