"""The operator's command line: flags, /healthz, Prometheus /metrics and all-namespaces mode."""
import os
import subprocess
import sys
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ddpjob_operator.controller.main import liveness_endpoint, parse_args, settings_for, watched_namespaces
from ddpjob_sandbox.jobs import make_manifest
from ddpjob_sandbox.readers import pod_names, status
from ddpjob_sandbox.scripted import set_terminated
from ddpjob_sandbox.operator_process import OperatorProcess
from ddpjob_sandbox.procs import free_port


def fetch(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=15) as response:
        return response.status, response.read().decode()


def test_flags_default_to_standalone_all_namespaces_with_both_endpoints():
    args = parse_args([])
    assert (args.namespace, args.peering, args.liveness_port, args.metrics_port) == ([], None, 8080, 9090)
    assert settings_for(args).scanning.disabled is False


def test_namespaces_repeat_and_turn_cluster_scanning_off():
    args = parse_args(["--namespace", "a", "-n", "b", "--peering", "ddpjob"])
    assert args.namespace == ["a", "b"] and args.peering == "ddpjob"
    assert settings_for(args).scanning.disabled is True


def test_namespace_patterns_keep_the_namespace_scan_that_resolves_them():
    assert settings_for(parse_args(["-n", "team-*"])).scanning.disabled is False


def test_standalone_and_peering_are_mutually_exclusive():
    result = subprocess.run([sys.executable, "-m", "ddpjob_operator", "--standalone", "--peering", "x"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "not allowed with argument" in result.stderr


@pytest.mark.parametrize("value", ["0", "1001"])
def test_max_replicas_defaults_to_500_and_stays_within_the_crds_maximum(capsys, value):
    assert parse_args([]).max_replicas == 500 and parse_args(["--max-replicas", "64"]).max_replicas == 64
    with pytest.raises(SystemExit):
        parse_args(["--max-replicas", value])
    assert f"--max-replicas ({value}) must be 1..1000, the CRD's own maximum" in capsys.readouterr().err


def test_scaling_flags_default_to_kubeflows_rate_and_16_passes_and_read_the_environment(monkeypatch):
    args = parse_args([])
    assert (args.kube_api_qps, args.kube_api_burst, args.max_concurrent_passes) == (20.0, 30, 16)
    monkeypatch.setenv("DDPJOB_KUBE_API_QPS", "200")
    monkeypatch.setenv("DDPJOB_MAX_CONCURRENT_PASSES", "64")
    args = parse_args(["--kube-api-burst", "400"])
    assert (args.kube_api_qps, args.kube_api_burst, args.max_concurrent_passes) == (200.0, 400, 64)
    assert parse_args(["--kube-api-qps", "0"]).kube_api_qps == 0, "0 turns the limit off"


@pytest.mark.parametrize("flags, message", [
    (["--kube-api-qps", "-1"], "--kube-api-qps (-1) must be 0 (no limit) or more"),
    (["--kube-api-burst", "0"], "--kube-api-burst (0) must be 1 or more"),
    (["--max-concurrent-passes", "0"], "--max-concurrent-passes (0) must be 1 or more"),
])
def test_scaling_flags_out_of_range_name_the_flag_value_and_rule(capsys, flags, message):
    with pytest.raises(SystemExit):
        parse_args(flags)
    assert message in capsys.readouterr().err


def test_exact_namespaces_are_watched_one_by_one_and_patterns_across_all():
    assert watched_namespaces(["a", "b"]) == ("a", "b")
    assert watched_namespaces(["a", "team-*"]) == watched_namespaces([]) == ()


def test_a_port_out_of_range_names_the_flag():
    with pytest.raises(SystemExit):
        parse_args(["--metrics-port", "70000"])


def test_healthz_and_metrics_are_served_and_count_jobs_by_phase_and_restart_budget(cluster, k8s, tmp_path):
    liveness, metrics = free_port(), free_port()
    command = [sys.executable, "-m", "ddpjob_operator", "--namespace", k8s.namespace,
               "--liveness-port", str(liveness), "--metrics-port", str(metrics)]
    with OperatorProcess(cluster, command, tmp_path / "operator.log") as process:
        k8s.create("ddpjobs", make_manifest(replicas=2))
        k8s.wait_for(lambda: len(pod_names(k8s)) == 2, timeout=20, what="two node pods")
        set_terminated(k8s, "mlp-node-1", 1)
        k8s.wait_for(lambda: status(k8s).get("restarts") == 1, what="a counted failure")
        assert k8s.wait_for(lambda: _get_or_none(f"http://127.0.0.1:{liveness}/healthz"), what="/healthz")[0] == 200
        text = k8s.wait_for(lambda: (t := _metrics(metrics)) and 'ddpjob_operator_jobs{phase="Restarting"} 1.0' in t
                            and t, what="the Restarting job in /metrics")
        assert "ddpjob_operator_pod_replacements_total 1.0" in text
        assert "ddpjob_operator_reconcile_seconds_count" in text
        # The budget from the job's status: no snapshot yet, so the failure is charged (1 of maxRestarts 3).
        job = {"namespace": k8s.namespace, "name": "mlp"}
        assert sample(text, "ddpjob_operator_restart_budget_used", **job, budget="maxRestarts") == 1
        assert sample(text, "ddpjob_operator_restart_budget_limit", **job, budget="maxRestarts") == 3
        assert sample(text, "ddpjob_operator_job_phase", **job, phase="Restarting") == 1
    log = process.log()
    assert "Traceback" not in log
    assert "Handler 'job_changed' succeeded" in log


def sample(text: str, series: str, **labels: str) -> float | None:
    """The value of one series in Prometheus' text format (None when absent)."""
    return next((s.value for family in text_string_to_metric_families(text) for s in family.samples
                 if s.name == series and s.labels == labels), None)


def test_the_healthz_url_binds_the_listen_address_or_every_interface():
    assert liveness_endpoint(0, "127.3.4.5") is None
    assert liveness_endpoint(8080) == "http://0.0.0.0:8080/healthz"
    assert liveness_endpoint(8080, "127.3.4.5") == "http://127.3.4.5:8080/healthz"
    assert liveness_endpoint(8080, "::1") == "http://[::1]:8080/healthz"


def test_two_operators_on_one_network_serve_healthz_and_metrics_each_on_its_listen_address(cluster, k8s, tmp_path):
    """Pods that share a host's network (the sandbox's kubelets; DDPJOB_LISTEN_HOST is each pod's
    own address) must not collide on the chart's one livenessPort: each binds its address only."""
    liveness, metrics = free_port(), free_port()
    command = [sys.executable, "-m", "ddpjob_operator", "--namespace", k8s.namespace,
               "--liveness-port", str(liveness), "--metrics-port", str(metrics)]
    with OperatorProcess(cluster, command, tmp_path / "a.log", env={"DDPJOB_LISTEN_HOST": "127.0.7.1"}), \
            OperatorProcess(cluster, command, tmp_path / "b.log", env={"DDPJOB_LISTEN_HOST": "127.0.7.2"}):
        for host in ("127.0.7.1", "127.0.7.2"):
            assert k8s.wait_for(lambda: _get_or_none(f"http://{host}:{liveness}/healthz"), timeout=60,
                                what=f"/healthz on {host}")[0] == 200
            assert k8s.wait_for(lambda: _get_or_none(f"http://{host}:{metrics}/metrics"), timeout=30,
                                what=f"/metrics on {host}")[0] == 200
        assert _get_or_none(f"http://127.0.0.1:{liveness}/healthz") is None, "bound every interface"


def test_without_namespaces_the_operator_serves_every_namespace(cluster, tmp_path):
    command = [sys.executable, "-m", "ddpjob_operator", "--liveness-port", "0", "--metrics-port", "0"]
    team_a, team_b = cluster.client("team-a"), cluster.client("team-b")
    with OperatorProcess(cluster, command, tmp_path / "operator.log") as process:
        team_a.create("ddpjobs", make_manifest("a", replicas=1))
        team_b.create("ddpjobs", make_manifest("b", replicas=2))
        team_a.wait_for(lambda: pod_names(team_a, "a") == ["a-node-0"], timeout=30, what="team-a's pod")
        team_b.wait_for(lambda: pod_names(team_b, "b") == ["b-node-0", "b-node-1"], timeout=30, what="team-b's pods")
    assert "Traceback" not in process.log()


def _get_or_none(url):
    try:
        return fetch(url)
    except OSError:
        return None


def _metrics(port):
    got = _get_or_none(f"http://127.0.0.1:{port}/metrics")
    return got[1] if got else ""


def test_a_namespace_pattern_serves_matching_namespaces_even_new_ones(cluster, tmp_path):
    command = [sys.executable, "-m", "ddpjob_operator", "-n", "team-*", "--liveness-port", "0", "--metrics-port", "0"]
    team_a, other = cluster.client("team-a"), cluster.client("other")
    team_a.create("ddpjobs", make_manifest("a", replicas=1))  # exists before the operator starts
    with OperatorProcess(cluster, command, tmp_path / "operator.log") as process:
        team_a.wait_for(lambda: pod_names(team_a, "a") == ["a-node-0"], timeout=30, what="team-a's pod")
        other.create("ddpjobs", make_manifest("o", replicas=1))
        team_b = cluster.client("team-b")  # a namespace created while the operator runs
        team_b.create("ddpjobs", make_manifest("b", replicas=1))
        team_b.wait_for(lambda: pod_names(team_b, "b") == ["b-node-0"], timeout=30, what="team-b's pod")
        assert pod_names(other, "o") == [], "a namespace outside the pattern is not served"
    assert "Traceback" not in process.log()


def test_an_unreadable_kubeconfig_stops_the_operator_with_a_message_naming_it(tmp_path):
    missing = tmp_path / "missing-kubeconfig"
    result = subprocess.run([sys.executable, "-m", "ddpjob_operator", "-n", "x", "--liveness-port", "0",
                             "--metrics-port", "0"], env={**os.environ, "KUBECONFIG": str(missing)},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert f"cannot read the kubeconfig ([Errno 2] No such file or directory: '{missing}')" in result.stderr
    assert "set KUBECONFIG to a readable kubeconfig file" in result.stderr
