"""The control plane's command lines (pure): every listener on loopback, and the flags the
cluster tier relies on."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from ddpjob_sandbox.control_plane import components as comp

LAYOUT = comp.Layout(root=Path("/state"), bin_dir=Path("/bin-dir"),
                     ports=comp.Ports(etcd=1001, etcd_peer=1002, apiserver=1003, controller_manager=1004,
                                      scheduler=1005))
ARGVS = {
    "etcd": comp.etcd_argv(LAYOUT),
    "kube-apiserver": comp.apiserver_argv(LAYOUT),
    "kube-controller-manager": comp.controller_manager_argv(LAYOUT),
    "kube-scheduler": comp.scheduler_argv(LAYOUT),
}
LISTEN_FLAGS = ("--listen-client-urls", "--listen-peer-urls", "--bind-address", "--advertise-address")


def flags(argv: list[str]) -> dict[str, str]:
    return dict(arg.split("=", 1) for arg in argv[1:] if "=" in arg)


@pytest.mark.parametrize("name", ARGVS)
def test_every_component_listens_on_loopback_only(name):
    listening = {k: v for k, v in flags(ARGVS[name]).items() if k in LISTEN_FLAGS}
    assert listening, f"{name} names no listen address: it would listen on every interface"
    for flag, value in listening.items():
        assert re.fullmatch(r"(http://)?127\.0\.0\.1(:\d+)?", value), f"{name} {flag}={value}"


def test_the_api_server_authorizes_by_node_and_rbac_and_admits_pods_by_pod_security():
    apiserver = flags(ARGVS["kube-apiserver"])
    assert apiserver["--authorization-mode"] == "Node,RBAC"
    assert {"PodSecurity", "ServiceAccount", "NodeRestriction"} <= set(apiserver["--enable-admission-plugins"].split(","))
    assert apiserver["--audit-log-path"] == "/state/logs/audit.log"


def test_the_controllers_act_as_their_service_accounts_signed_by_the_api_servers_key():
    manager = flags(ARGVS["kube-controller-manager"])
    assert manager["--use-service-account-credentials"] == "true"
    assert manager["--service-account-private-key-file"] == "/state/pki/sa.key"
    assert flags(ARGVS["kube-apiserver"])["--service-account-key-file"] == "/state/pki/sa.pub"


def test_the_node_lifecycle_controller_waits_the_layouts_grace_for_a_silent_node():
    assert flags(ARGVS["kube-controller-manager"])["--node-monitor-grace-period"] == \
        f"{comp.NODE_MONITOR_GRACE_SECONDS}s" == "40s"
    shorter = comp.Layout(root=LAYOUT.root, bin_dir=LAYOUT.bin_dir, ports=LAYOUT.ports, node_monitor_grace_seconds=16)
    assert flags(comp.controller_manager_argv(shorter))["--node-monitor-grace-period"] == "16s"


def test_a_tests_own_api_server_flags_come_after_the_standard_ones():
    assert "--watch-cache=false" not in ARGVS["kube-apiserver"]
    own = comp.Layout(root=LAYOUT.root, bin_dir=LAYOUT.bin_dir, ports=LAYOUT.ports,
                      apiserver_flags=("--watch-cache=false",))
    argv = comp.apiserver_argv(own)
    assert argv[:-1] == ARGVS["kube-apiserver"] and argv[-1] == "--watch-cache=false"
