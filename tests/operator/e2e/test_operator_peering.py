"""Operator replicas with kopf peering: one acts, the others stand by and take over.

kopf pauses every operator when two live peers share a priority, so replicas
started from one Deployment (same flags) must still rank differently. These
run two real operator processes against the emulator, as the chart's
``replicaCount: 2, peering.enabled: true`` does.
"""
import sys

import pytest
import yaml

from ddpjob_operator.controller.main import parse_args, settings_for, standby_priority
from ddpjob_sandbox.jobs import make_manifest
from ddpjob_sandbox.readers import pod_names
from ddpjob_sandbox.cluster import REPO
from ddpjob_sandbox.operator_process import OperatorProcess

PEERING = "ddpjob-operator"
PEERING_CRDS = REPO / "charts" / "ddpjob-operator" / "crds" / "kopf-peerings.yaml"


def test_an_older_process_ranks_higher_so_the_incumbent_keeps_acting():
    assert standby_priority(1_700_000_000.0) > standby_priority(1_700_000_000.001) > 0


def test_peering_replicas_get_distinct_priorities_unless_one_is_given():
    first = settings_for(parse_args(["--peering", PEERING])).peering.priority
    assert first > 0
    assert settings_for(parse_args(["--peering", PEERING, "--priority", "7"])).peering.priority == 7


def test_a_priority_without_peering_is_refused_naming_both_flags(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--priority", "7"])
    assert "--priority only matters with --peering NAME" in capsys.readouterr().err


def replica(cluster, k8s, tmp_path, name: str) -> OperatorProcess:
    command = [sys.executable, "-m", "ddpjob_operator", "--namespace", k8s.namespace, "--peering", PEERING,
               "--liveness-port", "0", "--metrics-port", "0"]
    # POD_ID is kopf's peer identity; the chart sets it to the pod's name.
    return OperatorProcess(cluster, command, tmp_path / f"{name}.log", env={"POD_ID": name})


def peers(k8s) -> dict[str, dict]:
    return k8s.get("kopfpeerings", PEERING).get("status") or {}


def test_of_two_replicas_the_older_acts_and_the_other_takes_over_when_it_stops(cluster, k8s, tmp_path):
    for crd in yaml.safe_load_all(PEERING_CRDS.read_text()):
        cluster.emulator.register_crd(crd)
    k8s.create("kopfpeerings", {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": PEERING}})
    first, second = replica(cluster, k8s, tmp_path, "replica-a"), replica(cluster, k8s, tmp_path, "replica-b")
    try:
        first.start()
        k8s.wait_for(lambda: "replica-a" in peers(k8s), timeout=30, what="replica-a in the peering object")
        second.start()
        k8s.wait_for(lambda: "replica-b" in peers(k8s), timeout=30, what="replica-b in the peering object")
        ranks = peers(k8s)
        assert ranks["replica-a"]["priority"] > ranks["replica-b"]["priority"]

        k8s.create("ddpjobs", make_manifest(replicas=2))
        k8s.wait_for(lambda: pod_names(k8s) == ["mlp-node-0", "mlp-node-1"], timeout=30, what="two node pods")
        assert "Handler 'job_changed' succeeded" in first.log()
        # Same priorities would pause both and leave the job without pods; a
        # standby that acted too would race the active replica on every write.
        assert "Handler 'job_changed'" not in second.log(), "the standby acted on the job too"
        assert "Pausing" not in first.log() and "Resuming" not in second.log()

        first.stop()  # a clean exit removes replica-a from the peering object at once
        k8s.wait_for(lambda: "Resuming operations after the pause" in second.log(), timeout=30,
                     what="replica-b taking over")
        k8s.patch("ddpjobs", "mlp", {"spec": {"replicas": 3}})
        k8s.wait_for(lambda: "mlp-node-2" in pod_names(k8s), timeout=30, what="replica-b scaling the job up")
    finally:
        first.stop()
        second.stop()
    for process in (first, second):
        assert "Traceback" not in process.log(), process.log()[-5000:]
