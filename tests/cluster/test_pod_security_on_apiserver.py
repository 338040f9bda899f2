"""Every pod ddpjob makes passes Pod Security "restricted", as the real API server enforces it.

A namespace labelled ``pod-security.kubernetes.io/enforce: restricted`` has the API server's
PodSecurity admission refuse any pod that breaks the profile; a server-side dry run
(tests/cluster/dry_run.py) puts each pod through it, and through the ServiceAccount and Priority
admission, without storing it. The pods: every one the operator renders (render/objects.py) for
the shipped examples and for each rendezvous topology, with and without podOverrides; the pod
each workload of the chart (every value set of tests/charts/test_chart.py) and of
manifests/examples/etcd.yaml makes from its template. Overrides that leave the profile are
refused, naming the controls they break, so an admitted pod is not a namespace that enforces
nothing.
"""
from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import pytest
import yaml

from ddpjob_operator.api.job_ref import JobRef
from ddpjob_operator.api.validation import parse_spec
from ddpjob_operator.render.objects import wanted_objects
from ddpjob_sandbox.client import KubeClient
from ddpjob_sandbox.control_plane import ControlPlane
from ddpjob_sandbox.examples import EXAMPLES, load_example
from ddpjob_sandbox.jobs import make_spec
from tests.charts.support import ROOT, render
from tests.charts.test_chart import VALUE_SETS
from tests.cluster.dry_run import refusal

pytestmark = pytest.mark.cluster

PRIORITY_CLASSES = "/apis/scheduling.k8s.io/v1/priorityclasses"
PRIORITY_CLASS = "ddpjob-pod-security-training"  # what OVERRIDES schedules with (the Priority plugin checks it exists)


@pytest.fixture(scope="module")
def restricted(control_plane: ControlPlane) -> Iterator[KubeClient]:
    """An admin client in a namespace of this module's own that enforces "restricted"."""
    kube = control_plane.client(namespace=f"restricted-{uuid.uuid4().hex[:6]}")
    kube.create("namespaces", {"metadata": {"name": kube.namespace,
                                            "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}})
    kube.request("POST", PRIORITY_CLASSES, {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                                            "metadata": {"name": PRIORITY_CLASS}, "value": 1000})
    try:
        yield kube
    finally:
        kube.request("DELETE", f"{PRIORITY_CLASSES}/{PRIORITY_CLASS}")
        kube.delete("namespaces", kube.namespace)


def with_account(kube: KubeClient, pod: dict) -> dict:
    """``pod``, once the ServiceAccount it runs as exists: the ServiceAccount admission refuses a
    pod whose account does not (a user creates the trainer's, the chart the operator's, the
    controller manager each namespace's `default`)."""
    account = pod["spec"].get("serviceAccountName") or "default"
    if account == "default":
        kube.wait_for(lambda: kube.find("serviceaccounts", "default"), timeout=30,
                      what=f"the default service account of {kube.namespace}")
    elif kube.find("serviceaccounts", account) is None:
        kube.create("serviceaccounts", {"metadata": {"name": account}})
    return pod


def refusals(kube: KubeClient, pods: list[dict]) -> dict[str, str | None]:
    """Each pod's name -> the API server's refusal message, or None where it admits it."""
    found = {}
    for pod in pods:
        error = refusal(kube, "pods", with_account(kube, pod))
        found[pod["metadata"]["name"]] = None if error is None else (
            error.body["message"] if isinstance(error.body, dict) else str(error))
    return found


def pods_of(kube: KubeClient, name: str, spec: dict) -> list[dict]:
    """Every pod the operator creates for DDPJob ``name`` with ``spec``, in the test's namespace."""
    ref = JobRef(name=name, namespace=kube.namespace, uid="6f1c2a9e-0000-4000-8000-000000000001")
    bodies = [wanted.body() for wanted in wanted_objects(ref, parse_spec(spec))]
    return [body for body in bodies if body["kind"] == "Pod"]


def rendered_pods(kube: KubeClient, spec_fields: dict) -> list[dict]:
    """Every pod of a job "mlp" with these spec fields (ddpjob_sandbox.jobs.make_spec)."""
    return pods_of(kube, "mlp", make_spec(**spec_fields))


OVERRIDES = {
    "snapshot": {"volume": {"persistentVolumeClaim": {"claimName": "mlp-snapshots"}}},
    "resources": {"limits": {"memory": "16Gi", "nvidia.com/gpu": 1}},
    "scheduling": {"nodeSelector": {"gpu": "h100"}, "tolerations": [{"key": "gpu", "operator": "Exists"}],
                   "priorityClassName": PRIORITY_CLASS, "queueName": "team-a"},
    "podOverrides": {"serviceAccountName": "trainer", "imagePullSecrets": [{"name": "ghcr"}],
                     "securityContext": {"runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000,
                                         "sysctls": [{"name": "net.ipv4.tcp_keepalive_time", "value": "60"}]},
                     "containerSecurityContext": {"readOnlyRootFilesystem": True},
                     "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "imagenet"}},
                                 {"name": "tmp", "emptyDir": {}}, {"name": "cfg", "configMap": {"name": "c"}}],
                     "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": True},
                                      {"name": "tmp", "mountPath": "/tmp"}, {"name": "cfg", "mountPath": "/cfg"}],
                     "labels": {"team": "vision"}, "annotations": {"owner": "ana"}},
}
JOBS = {
    "c10d store pod": ({}, {"mlp-node-0", "mlp-node-1", "mlp-rdzv"}),
    "c10d store on node 0": ({"elasticPolicy": {"rdzvStore": "node"}}, {"mlp-node-0", "mlp-node-1"}),
    "etcd-v3 with credentials": ({"elasticPolicy": {"rdzvBackend": "etcd-v3", "rdzvEndpoints": ["e:2379"],
                                                    "rdzvSecretName": "etcd-client"}}, {"mlp-node-0", "mlp-node-1"}),
    "etcd-v3 managed etcd": ({"elasticPolicy": {"rdzvBackend": "etcd-v3", "managedEtcd": {"enabled": True}}},
                             {"mlp-node-0", "mlp-node-1", "mlp-etcd"}),
    "etcd v2 managed etcd": ({"elasticPolicy": {"rdzvBackend": "etcd", "managedEtcd": {"enabled": True}}},
                             {"mlp-node-0", "mlp-node-1", "mlp-etcd"}),
}


@pytest.mark.parametrize("with_overrides", [False, True], ids=["defaults", "podOverrides"])
@pytest.mark.parametrize("job", sorted(JOBS))
def test_every_pod_the_operator_renders_is_admitted_by_a_restricted_namespace(restricted, job, with_overrides):
    fields, names = JOBS[job]
    pods = rendered_pods(restricted, {**fields, **(OVERRIDES if with_overrides else {})})
    assert refusals(restricted, pods) == dict.fromkeys(names)


@pytest.mark.parametrize("example", ["ddpjob-c10d.yaml", "ddpjob-etcd.yaml", "ddpjob-managed-etcd.yaml"])
def test_every_pod_of_each_shipped_example_is_admitted_by_a_restricted_namespace(restricted, example):
    body = load_example(example)
    pods = pods_of(restricted, body["metadata"]["name"], body["spec"])
    assert pods and refusals(restricted, pods) == dict.fromkeys(p["metadata"]["name"] for p in pods)


def test_the_override_example_in_the_install_docs_is_admitted_by_a_restricted_namespace(restricted):
    section = (ROOT / "docs" / "install.md").read_text().split("### Your own trainer image", 1)[1]
    example = yaml.safe_load(re.search(r"```yaml\n(.*?)```", section, re.DOTALL).group(1))["spec"]
    pods = rendered_pods(restricted, example)
    assert pods and refusals(restricted, pods) == dict.fromkeys(p["metadata"]["name"] for p in pods)


def test_overrides_that_leave_the_profile_are_refused_naming_each_control_they_break(restricted):
    pods = {p["metadata"]["name"]: p for p in rendered_pods(restricted, {"podOverrides": {
        "securityContext": {"runAsUser": 0, "runAsNonRoot": False},
        # allowPrivilegeEscalation: true is refused by validation (tests/operator/corpus/privilege-escalation.yaml)
        "containerSecurityContext": {"capabilities": {"add": ["IPC_LOCK"]}}}})}
    found = refusals(restricted, [pods["mlp-node-0"], pods["mlp-rdzv"]])
    root = ('runAsNonRoot != true (pod must not set securityContext.runAsNonRoot=false), '
            'runAsUser=0 (pod must not set runAsUser=0)')
    # kube-apiserver v1.37.2's words. The store pod takes who the pod runs as, not the trainer
    # container's capabilities.
    assert found == {
        "mlp-node-0": 'pods "mlp-node-0" is forbidden: violates PodSecurity "restricted:latest": unrestricted '
                      'capabilities (container "trainer" must set securityContext.capabilities.drop=["ALL"]; '
                      'container "trainer" must not include "IPC_LOCK" in securityContext.capabilities.add), ' + root,
        "mlp-rdzv": f'pods "mlp-rdzv" is forbidden: violates PodSecurity "restricted:latest": {root}',
    }


def template_pod(workload: dict) -> dict:
    """The pod a workload's controller makes from its template (the template's metadata and spec)."""
    template = workload["spec"]["template"]
    return {"apiVersion": "v1", "kind": "Pod", "spec": template["spec"],
            "metadata": {**(template.get("metadata") or {}), "name": f"{workload['metadata']['name']}-0"}}


def workloads(objects: list[dict]) -> list[dict]:
    return [obj for obj in objects if obj["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job")]


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_every_chart_workloads_pod_is_admitted_by_a_restricted_namespace(restricted, values):
    pods = [template_pod(w) for w in workloads(render(values, namespace=restricted.namespace))]
    assert pods and refusals(restricted, pods) == dict.fromkeys(p["metadata"]["name"] for p in pods)


def test_the_example_etcds_pod_is_admitted_by_a_restricted_namespace(restricted):
    pods = [template_pod(w) for w in workloads(list(yaml.safe_load_all((EXAMPLES / "etcd.yaml").read_text())))]
    assert pods and refusals(restricted, pods) == dict.fromkeys(p["metadata"]["name"] for p in pods)
