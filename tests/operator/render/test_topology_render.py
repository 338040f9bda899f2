"""The dedicated store pod and its Service as rendered, the node pods that use it, and the
rendezvous id of each generation."""

from __future__ import annotations

import ast
import sys

import pytest

from ddpjob_operator.api import constants as C
from ddpjob_operator.render.launch import rdzv_id
from ddpjob_operator.decide.observed import view_pod
from ddpjob_operator.render.store_pod import (
    STORE_PROGRAM, STORE_PROGRAM_MAX_BYTES, render_store_pod, render_store_service,
)
from ddpjob_operator.render.node_pod import render_pod
from ddpjob_operator.api.validation import parse_spec
from tests.operator.builders import job_ref
from ddpjob_sandbox.jobs import make_ddpjob
from tests.operator.topology_builders import STORE_POD, env_of


def store_job(**fields):
    job = make_ddpjob(replicas=2, **fields)
    job["spec"].setdefault("elasticPolicy", {})["rdzvStore"] = "pod"
    return job_ref(job), parse_spec(job["spec"])


def test_the_store_pod_runs_the_store_program_in_the_jobs_image_on_the_rendezvous_port():
    ref, spec = store_job(elasticPolicy={"rdzvPort": 29500}, image="pytorch/pytorch:2.13.0")
    pod = render_store_pod(ref, spec)
    (container,) = pod["spec"]["containers"]
    assert pod["metadata"]["name"] == "mlp-rdzv"
    assert (container["image"], container["command"], container["args"]) == (
        "pytorch/pytorch:2.13.0", ["python", "-c", STORE_PROGRAM], ["--port", "29500"])
    assert container["ports"] == [{"name": "rdzv", "containerPort": 29500, "protocol": "TCP"}]
    assert container["readinessProbe"]["tcpSocket"] == {"port": 29500}
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["metadata"]["ownerReferences"][0]["uid"] == "uid-mlp"


def top_level_imports(source: str) -> set[str]:
    """The top-level package of every import anywhere in ``source``."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            found.add("." if node.level else node.module.split(".")[0])
    return found


def test_the_store_program_needs_only_the_standard_library_and_torch_and_stays_small():
    """It runs with `python -c` in the user's image, where no ddpjob package may be installed
    (run there by tests/trainer/test_store_server.py and tests/cluster/sandbox/test_plain_image.py)."""
    assert top_level_imports(STORE_PROGRAM) - {"torch"} <= sys.stdlib_module_names
    assert len(STORE_PROGRAM.encode()) <= STORE_PROGRAM_MAX_BYTES


def test_the_store_pod_is_labelled_as_the_store_not_as_a_node():
    ref, spec = store_job()
    labels = render_store_pod(ref, spec)["metadata"]["labels"]
    assert labels[C.LABEL_JOB_NAME] == "mlp" and labels[C.LABEL_COMPONENT] == "rdzv-store"
    assert C.LABEL_NODE_INDEX not in labels
    assert view_pod(render_store_pod(ref, spec)).is_store and not view_pod(render_pod(ref, spec, 0)).is_store


def test_the_store_pod_keeps_priority_and_tolerations_but_not_the_gpu_placement():
    ref, spec = store_job(scheduling={"nodeSelector": {"gpu": "h100"}, "priorityClassName": "training",
                                      "tolerations": [{"key": "gpu", "operator": "Exists"}],
                                      "schedulerName": "volcano"})
    pod_spec = render_store_pod(ref, spec)["spec"]
    assert (pod_spec["priorityClassName"], pod_spec["tolerations"]) == ("training", [{"key": "gpu", "operator": "Exists"}])
    assert not {"nodeSelector", "affinity", "schedulerName"} & set(pod_spec)


def test_the_store_service_is_a_cluster_ip_service_selecting_only_the_store():
    ref, spec = store_job()
    svc = render_store_service(ref, spec)
    assert svc["metadata"]["name"] == "mlp-rdzv"
    assert "clusterIP" not in svc["spec"]  # a stable virtual IP across store replacements
    assert svc["spec"]["selector"] == {C.LABEL_JOB_NAME: "mlp", C.LABEL_COMPONENT: "rdzv-store"}
    assert svc["spec"]["ports"] == [{"name": "rdzv", "port": 29400, "targetPort": 29400, "protocol": "TCP"}]


def test_node_pods_join_the_store_service_as_clients_and_open_no_store_port():
    ref, spec = store_job()
    pod = render_pod(ref, spec, 0)
    env = env_of(pod)
    assert env["PET_RDZV_ENDPOINT"] == "mlp-rdzv.default.svc.cluster.local:29400"
    assert env["PET_RDZV_CONF"].split(",")[-1] == "is_host=false"
    assert [p["name"] for p in pod["spec"]["containers"][0]["ports"]] == ["progress"]


def test_with_the_store_on_node_0_node_0_hosts_and_the_others_join_it():
    job = make_ddpjob(replicas=2, elasticPolicy={"rdzvStore": "node"})
    pod = render_pod(job_ref(job), parse_spec(job["spec"]), 1)
    env = env_of(pod)
    assert env["PET_RDZV_ENDPOINT"] == "mlp-node-0.mlp.default.svc.cluster.local:29400"
    assert env["PET_RDZV_CONF"].endswith(",is_host=false")
    assert env_of(render_pod(job_ref(job), parse_spec(job["spec"]), 0))["PET_RDZV_CONF"].endswith(",is_host=true")
    assert pod["spec"]["containers"][0]["ports"][0]["containerPort"] == 29400


@pytest.mark.parametrize("generation, expected", [(0, "uid-mlp"), (1, "uid-mlp-1"), (7, "uid-mlp-7")])
def test_the_rendezvous_id_and_label_carry_the_generation(generation, expected):
    job = make_ddpjob(replicas=2, **STORE_POD)
    pod = render_pod(job_ref(job), parse_spec(job["spec"]), 0, generation)
    assert (env_of(pod)["PET_RDZV_ID"], rdzv_id("uid-mlp", generation)) == (expected, expected)
    assert pod["metadata"]["labels"][C.LABEL_RDZV_GENERATION] == str(generation)


def test_the_store_pod_name_fits_wherever_the_node_pod_names_fit():
    ref, spec = store_job()
    assert len(render_store_pod(ref, spec)["metadata"]["name"]) < len(render_pod(ref, spec, 0)["metadata"]["name"])


def test_ddpjob_render_shows_the_store_service_and_pod_before_the_nodes(tmp_path, capsys):
    import yaml

    from ddpjob_operator import cli

    job = make_ddpjob(replicas=2, **STORE_POD)
    del job["metadata"]["uid"]
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    assert cli.main(["render", str(path)]) == 0
    objects = list(yaml.safe_load_all(capsys.readouterr().out))
    # (the NetworkPolicy and the PodDisruptionBudget follow: tests/operator/api/test_cli.py)
    assert [(o["kind"], o["metadata"]["name"]) for o in objects if o["kind"] in ("Service", "Pod")] == [
        ("Service", "mlp"), ("Service", "mlp-rdzv"), ("Pod", "mlp-rdzv"), ("Pod", "mlp-node-0"), ("Pod", "mlp-node-1")]
