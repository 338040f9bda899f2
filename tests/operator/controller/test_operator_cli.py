"""The operator's command line: its flags, and a kubeconfig it cannot read. The operator serving
/healthz, /metrics and its namespaces on a real control plane: tests/cluster/controller/test_operator_serving.py."""
import os
import subprocess
import sys

import pytest

from ddpjob_operator.controller.main import liveness_endpoint, parse_args, settings_for, watched_namespaces


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


def test_an_unreadable_kubeconfig_stops_the_operator_with_a_message_naming_it(tmp_path):
    missing = tmp_path / "missing-kubeconfig"
    result = subprocess.run([sys.executable, "-m", "ddpjob_operator", "-n", "x", "--liveness-port", "0",
                             "--metrics-port", "0"], env={**os.environ, "KUBECONFIG": str(missing)},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert f"cannot read the kubeconfig ([Errno 2] No such file or directory: '{missing}')" in result.stderr
    assert "set KUBECONFIG to a readable kubeconfig file" in result.stderr


def test_the_healthz_url_binds_the_listen_address_or_every_interface():
    assert liveness_endpoint(0, "127.3.4.5") is None
    assert liveness_endpoint(8080) == "http://0.0.0.0:8080/healthz"
    assert liveness_endpoint(8080, "127.3.4.5") == "http://127.3.4.5:8080/healthz"
    assert liveness_endpoint(8080, "::1") == "http://[::1]:8080/healthz"
