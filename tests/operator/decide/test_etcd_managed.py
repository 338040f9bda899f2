"""The managed etcd (elasticPolicy.managedEtcd.enabled): rendered objects and plan, pure table tests."""
from __future__ import annotations

import pytest

from ddpjob_operator.api import constants as C
from ddpjob_operator.decide.managed_etcd import plan_managed_etcd
from ddpjob_operator.decide.observation import managed_etcd_requested as requested
from ddpjob_operator.decide.observed import ObservedEtcd, view_pod
from ddpjob_operator.render.etcd_pod import etcd_selector, render_etcd_pod, render_etcd_service
from ddpjob_operator.decide.actions import CreatePod, CreateService, DeletePod
from ddpjob_operator.render.node_pod import render_pod
from ddpjob_operator.render.common import selector
from ddpjob_operator.api.validation import parse_spec
from tests.operator.builders import job_ref
from ddpjob_sandbox.jobs import make_ddpjob

MANAGED = {"rdzvBackend": "etcd-v3", "managedEtcd": {"enabled": True}}


def job(**elastic):
    return make_ddpjob(namespace="team", uid="uid-1", elasticPolicy={**MANAGED, **elastic})


def plan(body, phase="Running", pod=None, service_exists=False):
    spec = parse_spec(body["spec"])
    return plan_managed_etcd(job_ref(body), spec, phase, ObservedEtcd(view_pod(pod) if pod else None, service_exists))


def etcd_pod(phase="Running", deleting=False):
    pod = render_etcd_pod(job_ref(job()), parse_spec(job()["spec"]))
    pod["status"] = {"phase": phase}
    if deleting:
        pod["metadata"]["deletionTimestamp"] = "2026-01-01T12:00:00Z"
    return pod


def kinds(actions):
    return [(type(a).__name__, getattr(a, "name", None) or a.body["metadata"]["name"]) for a in actions]


@pytest.mark.parametrize(("phase", "pod", "service_exists", "expected"), [
    ("Pending", None, False, [("CreateService", "mlp-etcd"), ("CreatePod", "mlp-etcd")]),
    ("Running", None, True, [("CreatePod", "mlp-etcd")]),
    ("Running", etcd_pod(), True, []),
    ("Running", etcd_pod("Failed"), True, [("DeletePod", "mlp-etcd")]),  # evicted: replaced next pass
    ("Running", etcd_pod("Failed", deleting=True), True, []),
    ("Succeeded", etcd_pod(), True, [("DeletePod", "mlp-etcd")]),  # holds nothing worth keeping
    ("Failed", None, True, []),
    ("Succeeded", etcd_pod(deleting=True), True, []),
], ids=["first pass", "service exists", "steady", "failed pod", "failed pod going", "finished",
        "finished, gone", "finished, going"])
def test_plan(phase, pod, service_exists, expected):
    assert kinds(plan(job(), phase, pod, service_exists)) == expected


def test_nothing_for_jobs_without_a_managed_etcd_or_with_an_invalid_spec():
    plain = make_ddpjob(elasticPolicy={"rdzvBackend": "etcd-v3", "rdzvEndpoints": ["e:1"]})
    assert plan_managed_etcd(job_ref(plain), parse_spec(plain["spec"]), "Running", None) == []
    assert plan_managed_etcd(job_ref(job()), None, "Running", ObservedEtcd(None, False)) == []
    assert not requested(plain) and requested(job())


def test_pod_and_service_are_owned_by_the_job_and_select_each_other_only():
    body = job()
    pod, service = render_etcd_pod(job_ref(body), parse_spec(body["spec"])), render_etcd_service(job_ref(body))

    for obj in (pod, service):
        assert obj["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
        assert obj["metadata"]["namespace"] == "team"
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    # Node-pod selectors (status, scaling, the headless Service) never match the etcd pod.
    assert C.LABEL_JOB_NAME not in pod["metadata"]["labels"]
    assert selector("mlp") == f"{C.LABEL_JOB_NAME}=mlp,{C.LABEL_COMPONENT}=node"
    assert etcd_selector("mlp") == "app.kubernetes.io/instance=mlp,app.kubernetes.io/component=etcd"


def test_nodes_point_at_the_managed_etcd_service():
    body = job()
    node = render_pod(job_ref(body), parse_spec(body["spec"]), 1)
    env = {e["name"]: e.get("value") for e in node["spec"]["containers"][0]["env"]}

    assert env["PET_RDZV_ENDPOINT"] == "mlp-etcd.team.svc.cluster.local:2379"
    assert env["PET_RDZV_BACKEND"] == "etcd-v3"


@pytest.mark.parametrize(("backend", "v2_flag"), [("etcd-v3", False), ("etcd", True)])
def test_etcd_serves_the_v2_api_only_for_torchs_etcd_backend(backend, v2_flag):
    body = job(rdzvBackend=backend)
    args = render_etcd_pod(job_ref(body), parse_spec(body["spec"]))["spec"]["containers"][0]["args"]

    assert ("--enable-v2=true" in args) is v2_flag
    assert "--advertise-client-urls=http://mlp-etcd.team.svc:2379" in args
    assert "--initial-cluster=mlp-etcd=http://127.0.0.1:2380" in args


def test_the_image_can_be_overridden_and_the_pod_runs_non_root():
    body = job(managedEtcd={"enabled": True, "image": "registry.local/etcd:v3.5.21"})
    pod = render_etcd_pod(job_ref(body), parse_spec(body["spec"]))

    assert pod["spec"]["containers"][0]["image"] == "registry.local/etcd:v3.5.21"
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert pod["spec"]["restartPolicy"] == "Always"



def test_ddpjob_render_shows_the_managed_etcd_next_to_the_nodes(tmp_path, capsys):
    import yaml

    from ddpjob_operator import cli

    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": C.API_VERSION, "kind": C.KIND, "metadata": {"name": "mlp"},
                                    "spec": job()["spec"]}))

    assert cli.main(["render", str(path)]) == 0

    objects = list(yaml.safe_load_all(capsys.readouterr().out))
    # (the NetworkPolicy and the PodDisruptionBudget follow: tests/operator/api/test_cli.py)
    assert [(o["kind"], o["metadata"]["name"]) for o in objects if o["kind"] in ("Service", "Pod")] == [
        ("Service", "mlp"), ("Service", "mlp-etcd"), ("Pod", "mlp-etcd"), ("Pod", "mlp-node-0"), ("Pod", "mlp-node-1")]
