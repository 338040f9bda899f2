"""The Helm chart lints, renders valid Kubernetes objects, and grants only what the operator uses.

That its workloads' pods pass Pod Security "restricted" and that its RBAC lets the operator do what
docs/install.md says are the real API server's to judge: tests/cluster/test_pod_security_on_apiserver.py
and tests/cluster/test_chart_rbac_on_apiserver.py.
"""
from __future__ import annotations

import re

import helm_python as helm
import pytest
import yaml

from tests.charts.support import (
    CHART_DIR, KUBE_VERSIONS, NAMESPACE, RELEASE, by_kind, one, render, render_notes, validate_k8s,
)

NAMESPACED = {"watchNamespaces": ["team-a", "team-b"]}
METRICS_ON = {"metrics": {"enabled": True, "serviceMonitor": {"enabled": True}}}
CUSTOM_IMAGE = {"image": {"repository": "registry.example.com/ml/ddpjob-operator", "tag": "0.1.0-rc1",
                          "pullPolicy": "Always"}}
PEERING = {"peering": {"enabled": True, "name": "ddpjob"}, "replicaCount": 2}
VALUE_SETS = {
    "defaults": {},
    "namespaced": NAMESPACED,
    "metrics": METRICS_ON,
    "monitoring": {"metrics": {**METRICS_ON["metrics"], "grafanaDashboard": {"enabled": True},
                               "prometheusRule": {"enabled": True}}},
    "custom-image": CUSTOM_IMAGE,
    "peering": PEERING,
    "peering-namespaced": {**PEERING, **NAMESPACED},
    "shared-etcd": {"etcd": {"enabled": True, "enableV2": True}},
}


def container(objects: list[dict]) -> dict:
    return one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]


def rules_of(role: dict) -> dict[tuple[str, str], set[str]]:
    """{(apiGroup, resource): verbs} of a (Cluster)Role, one entry per group/resource pair."""
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    return granted


# What the operator does in a namespace (handlers, kube module, kopf's own writes).
NAMESPACED_GRANTS = {
    ("ddpjob.io", "ddpjobs"): {"list", "watch", "patch", "delete"},
    ("ddpjob.io", "ddpjobs/status"): {"patch"},
    ("ddpjob.io", "ddpjobs/finalizers"): {"update"},
    ("", "pods"): {"list", "watch", "create", "delete"},
    ("", "services"): {"list", "watch", "create"},
    ("", "events"): {"create"},
    ("networking.k8s.io", "networkpolicies"): {"list", "watch", "create", "patch"},  # spec.networkPolicy, one per job
    ("policy", "poddisruptionbudgets"): {"list", "watch", "create", "patch", "delete"},  # runPolicy.podDisruptionBudget
}  # Secrets only with rbac.readSecrets (tests/cluster/test_chart_rbac_on_apiserver.py)
CRD_WATCH = {("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"}}
NODE_READ = {("", "nodes"): {"get"}}  # a stuck terminating pod's node: NotReady or gone -> force delete


def test_chart_lints_without_errors_or_warnings():
    report = helm.lint(CHART_DIR, strict=True, kube_version=f"v{KUBE_VERSIONS[-1]}")
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert report["errors"] == [] and problems == [], report


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_chart_lints_with_each_value_set(values):
    report = helm.lint(CHART_DIR, values, strict=True, kube_version=f"v{KUBE_VERSIONS[0]}")
    assert report["errors"] == [], report


@pytest.mark.parametrize("version", KUBE_VERSIONS)
@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_every_rendered_builtin_object_passes_strict_kubernetes_validation(values, version):
    objects = render(values)
    builtin = [obj for obj in objects if obj["apiVersion"].split("/")[0] not in ("kopf.dev", "monitoring.coreos.com")]
    assert builtin, "nothing rendered"
    for obj in builtin:
        validate_k8s(obj, version)


def test_default_install_runs_standalone_cluster_wide_without_metrics():
    objects = render()
    assert {obj["kind"] for obj in objects} == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Deployment"}
    main = container(objects)
    assert main["command"] == ["python", "-m", "ddpjob_operator"]
    assert main["args"] == ["--standalone", "--liveness-port=8080", f"--operator-namespace={NAMESPACE}",
                            f"--operator-pod-selector=app.kubernetes.io/name=ddpjob-operator,"
                            f"app.kubernetes.io/instance={RELEASE}", "--metrics-port=0", "--max-replicas=500",
                            "--progress-poll-seconds=30", "--status-write-interval-seconds=600",
                            "--kube-api-qps=20", "--kube-api-burst=30",
                            "--max-concurrent-passes=16"]
    assert main["image"] == "ghcr.io/ddpjob/operator:0.1.0"


def test_default_rbac_grants_exactly_the_operator_verbs_cluster_wide():
    objects = render()
    assert by_kind(objects, "Role") == [] and by_kind(objects, "RoleBinding") == []
    assert rules_of(one(objects, "ClusterRole")) == {**CRD_WATCH, **NODE_READ, **NAMESPACED_GRANTS}
    binding = one(objects, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == one(objects, "ClusterRole")["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": RELEASE, "namespace": NAMESPACE}]


def test_rbac_never_uses_wildcards():
    for values in VALUE_SETS.values():
        for role in by_kind(render(values), "ClusterRole") + by_kind(render(values), "Role"):
            for rule in role["rules"]:
                assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"], rule


def test_namespace_list_gives_one_role_per_namespace_and_cluster_wide_only_node_reads():
    objects = render(NAMESPACED)
    roles = by_kind(objects, "Role")
    assert [role["metadata"]["namespace"] for role in roles] == ["team-a", "team-b"]
    for role in roles:
        assert rules_of(role) == NAMESPACED_GRANTS
    bindings = by_kind(objects, "RoleBinding")
    assert [(b["metadata"]["namespace"], b["roleRef"]["kind"], b["subjects"][0]["namespace"]) for b in bindings] == [
        ("team-a", "Role", NAMESPACE), ("team-b", "Role", NAMESPACE)]
    # With explicit namespaces the operator turns kopf's cluster-wide scanning off: cluster-scoped
    # is only reading Nodes (no Role can grant a cluster-scoped resource).
    cluster_role = one(objects, "ClusterRole")
    assert rules_of(cluster_role) == NODE_READ
    binding = one(objects, "ClusterRoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": cluster_role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": RELEASE, "namespace": NAMESPACE}]
    assert container(objects)["args"][:2] == ["--namespace=team-a", "--namespace=team-b"]


def test_watched_namespaces_without_node_reads_render_nothing_cluster_scoped():
    # What the operator may then do, as the API server evaluates it: tests/cluster/test_chart_rbac_on_apiserver.py.
    objects = render({**NAMESPACED, "rbac": {"readNodes": False}, "peering": {"enabled": True}})
    assert by_kind(objects, "ClusterRole") == [] and by_kind(objects, "ClusterRoleBinding") == []


def test_metrics_on_serves_the_port_and_a_service_that_selects_the_operator_pod():
    objects = render(METRICS_ON)
    main = container(objects)
    assert "--metrics-port=9090" in main["args"]
    assert {"name": "metrics", "containerPort": 9090, "protocol": "TCP"} in main["ports"]
    service = one(objects, "Service")
    pod_labels = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 9090, "targetPort": "metrics", "protocol": "TCP"}]
    monitor = one(objects, "ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"


def test_metrics_off_renders_no_service_and_metrics_port_zero():
    objects = render({"metrics": {"enabled": False, "serviceMonitor": {"enabled": True}}})
    assert by_kind(objects, "Service") == [] and by_kind(objects, "ServiceMonitor") == []
    assert "--metrics-port=0" in container(objects)["args"]


def test_custom_image_sets_repository_tag_and_pull_policy():
    main = container(render(CUSTOM_IMAGE))
    assert main["image"] == "registry.example.com/ml/ddpjob-operator:0.1.0-rc1"
    assert main["imagePullPolicy"] == "Always"


def test_operator_pod_is_hardened():
    pod = one(render(), "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    security = pod["containers"][0]["securityContext"]
    assert security == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                        "capabilities": {"drop": ["ALL"]}}
    assert pod["containers"][0]["resources"]["limits"]["memory"]


def test_the_operator_pod_keeps_its_api_token():
    # The one pod that needs the API: the token must not be switched off by a later edit.
    pod = one(render(), "Deployment")["spec"]["template"]["spec"]
    assert pod.get("automountServiceAccountToken", True) is True
    assert pod["serviceAccountName"] == "ddpjob-operator"


def test_liveness_probe_hits_healthz_on_the_liveness_port():
    main = container(render({"livenessPort": 8181}))
    assert "--liveness-port=8181" in main["args"]
    probe = main["livenessProbe"]["httpGet"]
    assert probe["path"] == "/healthz"
    named = {port["name"]: port["containerPort"] for port in main["ports"]}
    assert named[probe["port"]] == 8181


def test_peering_replaces_standalone_and_creates_the_peering_object_and_its_rbac():
    objects = render(PEERING)
    args = container(objects)["args"]
    assert "--peering=ddpjob" in args and "--standalone" not in args
    assert one(objects, "Deployment")["spec"]["replicas"] == 2
    assert one(objects, "ClusterKopfPeering")["metadata"]["name"] == "ddpjob"
    assert rules_of(one(objects, "ClusterRole"))[("kopf.dev", "clusterkopfpeerings")] == {"list", "watch", "patch"}
    # kopf's peer identity is the pod name, so the peering object shows which replica acts.
    pod_id = {e["name"]: e for e in container(objects)["env"]}["POD_ID"]
    assert pod_id["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert "POD_ID" not in {e["name"] for e in container(render({}))["env"]}, "standalone has no peers to name"


def test_namespaced_peering_uses_a_kopfpeering_per_watched_namespace():
    objects = render({**PEERING, **NAMESPACED})
    assert [(p["metadata"]["namespace"], p["metadata"]["name"]) for p in by_kind(objects, "KopfPeering")] == [
        ("team-a", "ddpjob"), ("team-b", "ddpjob")]
    for role in by_kind(objects, "Role"):
        assert rules_of(role)[("kopf.dev", "kopfpeerings")] == {"list", "watch", "patch"}


def test_kopf_peering_crds_ship_with_the_chart():
    with helm.Chart.load(CHART_DIR) as chart:
        names = {doc["metadata"]["name"] for crd in chart.crds for doc in yaml.safe_load_all(crd["data"]) if doc}
    assert {"clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"} <= names


def test_several_replicas_without_peering_fail_with_an_actionable_message():
    with pytest.raises(helm.HelmRenderError,
                       match=r"replicaCount \(2\) must be 1 unless peering.enabled=true"):
        render({"replicaCount": 2})


def test_metrics_port_equal_to_liveness_port_is_rejected():
    with pytest.raises(helm.HelmRenderError, match=r"metrics.port \(8080\) must differ from livenessPort \(8080\)"):
        render({"metrics": {"enabled": True, "port": 8080}})


def test_max_replicas_reaches_the_operator():
    assert "--max-replicas=64" in container(render({"maxReplicas": 64}))["args"]


def test_the_progress_poll_interval_reaches_the_operator():
    assert "--progress-poll-seconds=5" in container(render({"progressPollSeconds": 5}))["args"]


def test_the_status_write_interval_reaches_the_operator():
    assert "--status-write-interval-seconds=0" in container(render({"statusWriteIntervalSeconds": 0}))["args"]


def test_extra_args_env_and_verbose_reach_the_container():
    main = container(render({"verbose": True, "extraArgs": ["--debug-handlers"],
                             "extraEnv": [{"name": "KOPF_X", "value": "1"}]}))
    assert main["args"][-2:] == ["--verbose", "--debug-handlers"]
    assert {"name": "KOPF_X", "value": "1"} in main["env"]


def test_notes_tell_the_next_step():
    notes = render_notes()
    assert "kubectl apply -f" in notes and "manifests/examples/ddpjob-c10d.yaml" in notes
    assert "all namespaces" in notes
    assert "team-a, team-b" in render_notes(NAMESPACED)


def test_packaged_chart_renders_the_same_as_the_directory(tmp_path):
    archive = helm.package(CHART_DIR, destination=tmp_path)
    assert archive.endswith("ddpjob-operator-0.1.0.tgz")
    with helm.Chart.load(archive) as packaged, helm.Chart.load(CHART_DIR) as directory:
        assert packaged.render(name=RELEASE, namespace=NAMESPACE) == directory.render(name=RELEASE, namespace=NAMESPACE)
        assert sorted(c["filename"] for c in packaged.crds) == sorted(c["filename"] for c in directory.crds)
