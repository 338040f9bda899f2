"""Every pod the operator renders passes Pod Security "restricted"; the checker itself catches each rule.

The checker (tests/support/pod_security.py) writes the profile's rules down; the
first half of this file proves that each rule fires on a pod that breaks it and
stays quiet on the allowed values, the second half runs it over every pod kind
the operator creates (node pods of each backend, the c10d store pod, the managed
etcd pod), with and without podOverrides, and over the spec rules that guard the
security overrides.
"""
from __future__ import annotations

import copy
from collections.abc import Callable

import pytest

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.job_ref import JobRef
from ddpjob_operator.api.validation import parse_spec, validate_spec
from ddpjob_operator.render.etcd_pod import render_etcd_pod
from ddpjob_operator.render.node_pod import render_pod
from ddpjob_operator.render.store_pod import render_store_pod
from ddpjob_sandbox.jobs import make_spec
from tests.operator.api.test_crd import schema_validator, without_nulls
from tests.support.pod_security import APPARMOR_ANNOTATION, violations

REF = JobRef(name="mlp", namespace="team-a", uid="6f1c2a9e-0000-4000-8000-000000000001")


# --- The checker ------------------------------------------------------------------------------

def restricted_pod() -> dict:
    """The smallest pod that passes "restricted"."""
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "spec": {
            "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "app", "image": "i", "securityContext": {
                "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}],
            "volumes": [{"name": "scratch", "emptyDir": {}}],
        },
    }


def changed(change: Callable[[dict, dict, dict], None]) -> dict:
    """restricted_pod() after `change(metadata, pod spec, container)`."""
    pod = copy.deepcopy(restricted_pod())
    change(pod["metadata"], pod["spec"], pod["spec"]["containers"][0])
    return pod


def pod_sc(key, value):
    return lambda meta, spec, c: spec["securityContext"].__setitem__(key, value)


def box_sc(key, value):
    return lambda meta, spec, c: c["securityContext"].__setitem__(key, value)


def volume(source):
    return lambda meta, spec, c: spec["volumes"].append({"name": "v", **source})


def without_pod_seccomp(meta, spec, c):
    del spec["securityContext"]["seccompProfile"]


def without_pod_non_root(meta, spec, c):
    del spec["securityContext"]["runAsNonRoot"]


def pod_field(key, value):
    return lambda meta, spec, c: spec.__setitem__(key, value)


def moved_to_the_container(remove, key, value):
    """Drop a pod-level field (with `remove`) and set `key` on the container instead."""
    def change(meta, spec, c):
        remove(meta, spec, c)
        c["securityContext"][key] = value
    return change


BROKEN = [
    ("host process", pod_sc("windowsOptions", {"hostProcess": True}),
     ["HostProcess: spec.securityContext.windowsOptions.hostProcess is true"]),
    ("host network", pod_field("hostNetwork", True), ["Host Namespaces: spec.hostNetwork is true"]),
    ("host pid", pod_field("hostPID", True), ["Host Namespaces: spec.hostPID is true"]),
    ("host ipc", pod_field("hostIPC", True), ["Host Namespaces: spec.hostIPC is true"]),
    ("privileged", box_sc("privileged", True), ["Privileged Containers: container app is privileged"]),
    ("capability outside both lists", box_sc("capabilities", {"drop": ["ALL"], "add": ["SYS_ADMIN"]}),
     ["Capabilities: container app adds ['SYS_ADMIN']",
      "Capabilities (restricted): container app adds ['SYS_ADMIN'] (only NET_BIND_SERVICE is allowed)"]),
    ("capability baseline allows", box_sc("capabilities", {"drop": ["ALL"], "add": ["CHOWN"]}),
     ["Capabilities (restricted): container app adds ['CHOWN'] (only NET_BIND_SERVICE is allowed)"]),
    ("capabilities not dropped", box_sc("capabilities", {"drop": ["NET_RAW"]}),
     ["Capabilities (restricted): container app does not drop ALL capabilities"]),
    ("hostPath volume", volume({"hostPath": {"path": "/"}}),
     ["HostPath Volumes: volume v is a hostPath", "Volume Types: volume v is a hostPath"]),
    ("nfs volume", volume({"nfs": {"server": "s", "path": "/"}}), ["Volume Types: volume v is a nfs"]),
    ("host port", lambda meta, spec, c: c.update(ports=[{"containerPort": 80, "hostPort": 8080}]),
     ["Host Ports: container app uses hostPort 8080"]),
    ("apparmor unconfined", pod_sc("appArmorProfile", {"type": "Unconfined"}),
     ["AppArmor: spec.securityContext.appArmorProfile is Unconfined"]),
    ("apparmor annotation unconfined",
     lambda meta, spec, c: meta.update(annotations={f"{APPARMOR_ANNOTATION}app": "unconfined"}),
     [f"AppArmor: annotation {APPARMOR_ANNOTATION}app is unconfined"]),
    ("selinux custom type", box_sc("seLinuxOptions", {"type": "spc_t"}),
     ["SELinux: container app.seLinuxOptions.type is spc_t"]),
    ("selinux user", pod_sc("seLinuxOptions", {"user": "system_u"}),
     ["SELinux: spec.securityContext.seLinuxOptions.user is set"]),
    ("unmasked proc", box_sc("procMount", "Unmasked"), ["/proc Mount Type: container app procMount is Unmasked"]),
    ("seccomp unconfined", box_sc("seccompProfile", {"type": "Unconfined"}),
     ["Seccomp: container app.seccompProfile is Unconfined",
      "Seccomp (restricted): container app has no RuntimeDefault or Localhost seccomp profile"]),
    ("no seccomp profile", without_pod_seccomp,
     ["Seccomp (restricted): container app has no RuntimeDefault or Localhost seccomp profile"]),
    ("unsafe sysctl", pod_sc("sysctls", [{"name": "kernel.msgmax", "value": "1"}]),
     ["Sysctls: sysctl kernel.msgmax is not a safe sysctl"]),
    ("privilege escalation", box_sc("allowPrivilegeEscalation", True),
     ["Privilege Escalation: container app does not set allowPrivilegeEscalation: false"]),
    ("no runAsNonRoot", without_pod_non_root,
     ["Running as Non-root: container app may run as root (runAsNonRoot is not true)"]),
    ("container runAsNonRoot false", box_sc("runAsNonRoot", False),
     ["Running as Non-root: container app may run as root (runAsNonRoot is not true)"]),
    ("root uid", pod_sc("runAsUser", 0), ["Running as Non-root user: spec.securityContext.runAsUser is 0"]),
    ("init container unhardened", lambda meta, spec, c: spec.update(initContainers=[{"name": "init", "image": "i"}]),
     ["Privilege Escalation: container init does not set allowPrivilegeEscalation: false",
      "Capabilities (restricted): container init does not drop ALL capabilities"]),
]

ALLOWED = [
    ("NET_BIND_SERVICE added", box_sc("capabilities", {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]})),
    ("apparmor localhost", box_sc("appArmorProfile", {"type": "Localhost", "localhostProfile": "p"})),
    ("selinux container type and level", pod_sc("seLinuxOptions", {"type": "container_t", "level": "s0:c1,c2"})),
    ("default proc mount", box_sc("procMount", "Default")),
    ("seccomp on the container only", moved_to_the_container(
        without_pod_seccomp, "seccompProfile", {"type": "Localhost", "localhostProfile": "p"})),
    ("runAsNonRoot on the container only", moved_to_the_container(without_pod_non_root, "runAsNonRoot", True)),
    ("safe sysctl", pod_sc("sysctls", [{"name": "net.ipv4.ip_unprivileged_port_start", "value": "0"}])),
    ("non-zero uid", pod_sc("runAsUser", 1000)),
    ("allowed volume types", lambda meta, spec, c: spec["volumes"].extend(
        {"name": k, k: {}} for k in ("configMap", "secret", "persistentVolumeClaim", "projected", "downwardAPI"))),
]


def test_the_smallest_restricted_pod_passes():
    assert violations(restricted_pod()) == []


@pytest.mark.parametrize("change,expected", [c[1:] for c in BROKEN], ids=[c[0] for c in BROKEN])
def test_the_checker_names_each_broken_rule(change, expected):
    assert violations(changed(change)) == expected


@pytest.mark.parametrize("change", [c[1] for c in ALLOWED], ids=[c[0] for c in ALLOWED])
def test_the_checker_accepts_each_allowed_value(change):
    assert violations(changed(change)) == []


def test_the_checker_reads_the_pod_template_of_a_workload():
    pod = changed(pod_sc("runAsUser", 0))
    deployment = {"kind": "Deployment", "spec": {"template": {"metadata": pod["metadata"], "spec": pod["spec"]}}}
    assert violations(deployment) == ["Running as Non-root user: spec.securityContext.runAsUser is 0"]


# --- Every rendered pod -----------------------------------------------------------------------

def rendered_pods(spec_fields: dict) -> dict[str, dict]:
    """Every pod a job with these spec fields gets, by name: what plan.py and managed_etcd.py create."""
    spec = parse_spec(make_spec(**spec_fields))
    pods = [render_pod(REF, spec, i) for i in range(spec.max_replicas)]
    if spec.elastic_policy.store_on_pod:
        pods.append(render_store_pod(REF, spec))
    if spec.elastic_policy.managed_etcd.enabled:
        pods.append(render_etcd_pod(REF, spec))
    return {p["metadata"]["name"]: p for p in pods}


OVERRIDES = {
    "snapshot": {"volume": {"persistentVolumeClaim": {"claimName": "mlp-snapshots"}}},
    "resources": {"limits": {"memory": "16Gi", "nvidia.com/gpu": 1}},
    "scheduling": {"nodeSelector": {"gpu": "h100"}, "tolerations": [{"key": "gpu", "operator": "Exists"}],
                   "priorityClassName": "training", "queueName": "team-a"},
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
def test_every_rendered_pod_passes_the_restricted_profile(job, with_overrides):
    fields, names = JOBS[job]
    pods = rendered_pods({**fields, **(OVERRIDES if with_overrides else {})})
    assert set(pods) == names
    assert {name: violations(pod) for name, pod in pods.items()} == {name: [] for name in names}


def test_overrides_that_leave_the_profile_are_applied_and_show_up_in_the_checker():
    pods = rendered_pods({"podOverrides": {
        "securityContext": {"runAsUser": 0, "runAsNonRoot": False},
        # allowPrivilegeEscalation: true is refused by validation now (tests/operator/corpus/privilege-escalation.yaml)
        "containerSecurityContext": {"capabilities": {"add": ["IPC_LOCK"]}}}})
    assert violations(pods["mlp-node-0"]) == [
        "Capabilities: container trainer adds ['IPC_LOCK']",
        "Running as Non-root: container trainer may run as root (runAsNonRoot is not true)",
        "Running as Non-root user: spec.securityContext.runAsUser is 0",
        "Capabilities (restricted): container trainer does not drop ALL capabilities",
        "Capabilities (restricted): container trainer adds ['IPC_LOCK'] (only NET_BIND_SERVICE is allowed)",
    ]
    # The store pod takes the pod level (who it runs as) but keeps its own container defaults.
    assert violations(pods["mlp-rdzv"]) == [
        "Running as Non-root: container store may run as root (runAsNonRoot is not true)",
        "Running as Non-root user: spec.securityContext.runAsUser is 0",
    ]


# --- The spec fields behind it ----------------------------------------------------------------

@pytest.mark.parametrize("overrides,message", [
    ({"securityContext": {"runAsUser": 0}},
     "spec.podOverrides.securityContext.runAsUser (0) is root, which runAsNonRoot: true (the default) forbids, "
     "so the kubelet would never start the container: also set spec.podOverrides.securityContext.runAsNonRoot: false"),
    ({"containerSecurityContext": {"runAsUser": 0}},
     "spec.podOverrides.containerSecurityContext.runAsUser (0) is root, which runAsNonRoot: true (the default) "
     "forbids, so the kubelet would never start the container: also set "
     "spec.podOverrides.containerSecurityContext.runAsNonRoot: false"),
    ({"securityContext": {"runAsUser": 0, "runAsNonRoot": False}, "containerSecurityContext": {"runAsNonRoot": True}},
     "spec.podOverrides.containerSecurityContext.runAsUser (0) is root, which runAsNonRoot: true (the default) "
     "forbids, so the kubelet would never start the container: also set "
     "spec.podOverrides.containerSecurityContext.runAsNonRoot: false"),
    ({"securityContext": {"runAsUser": -1}}, "spec.podOverrides.securityContext.runAsUser (-1) must be >= 0"),
    ({"containerSecurityContext": {"procMount": "Host"}},
     "spec.podOverrides.containerSecurityContext.procMount (\"Host\") must be one of 'Default' or 'Unmasked'"),
    ({"containerSecurityContext": {"runAsUsr": 1000}},
     "spec.podOverrides.containerSecurityContext.runAsUsr (1000) is not a field of this object: "
     "did you mean 'runAsUser'?"),
    ({"securityContext": {"seccompProfile": {"type": "None"}}},
     "spec.podOverrides.securityContext.seccompProfile.type (\"None\") must be one of "
     "'RuntimeDefault', 'Localhost' or 'Unconfined'"),
])
def test_security_overrides_that_cannot_work_are_rejected_naming_the_field(overrides, message):
    assert [e.message for e in validate_spec(make_spec(podOverrides=overrides))] == [message]


@pytest.mark.parametrize("overrides", [
    {"securityContext": {"runAsUser": 0, "runAsNonRoot": False}},
    {"securityContext": {"runAsNonRoot": False}, "containerSecurityContext": {"runAsUser": 0}},
    {"containerSecurityContext": {"runAsUser": 0, "runAsNonRoot": False}},
])
def test_running_as_root_is_allowed_when_runasnonroot_is_turned_off_where_it_applies(overrides):
    assert validate_spec(make_spec(podOverrides=overrides)) == []


@pytest.mark.parametrize("size", ["0", "0Gi", "0.0", "-1Gi", "500m", "8GB", "1e9", ""])
def test_a_shared_memory_size_must_be_a_positive_byte_quantity(size):
    message = 'must be a size in bytes above zero, written as a quantity string such as "8Gi" or "512Mi"'
    assert [e.message for e in validate_spec(make_spec(sharedMemorySize=size))] == [
        f'spec.sharedMemorySize ("{size}") {message}']
    assert list(schema_validator().iter_errors(without_nulls(make_spec(sharedMemorySize=size))))


@pytest.mark.parametrize("size", ["8Gi", "1.5Gi", "512Mi", "1G", ".5Gi", "1048576"])
def test_positive_shared_memory_sizes_pass_the_model_and_the_crd_schema(size):
    spec = make_spec(sharedMemorySize=size)
    assert validate_spec(spec) == []
    assert list(schema_validator().iter_errors(without_nulls(spec))) == []


def test_the_default_uid_is_the_one_documented_in_the_security_fields():
    # The CRD and docs/reference.md say which uid the pods run as; they must follow the constant.
    from ddpjob_operator.api import crd

    reference = crd.field_reference()
    assert f"runAsUser/runAsGroup/fsGroup {C.POD_UID}" in reference
    assert render_pod(REF, parse_spec(make_spec()), 0)["spec"]["securityContext"]["runAsUser"] == C.POD_UID


def test_the_managed_etcd_pod_runs_non_root_read_only_and_without_a_token():
    spec = parse_spec(make_spec(elasticPolicy={"rdzvBackend": "etcd-v3", "managedEtcd": {"enabled": True}},
                                podOverrides={"serviceAccountName": "trainer", "securityContext": {"runAsUser": 1000}}))
    pod = render_etcd_pod(REF, spec)["spec"]
    # Its own image, so neither the trainer's account nor its uid override applies.
    assert pod["automountServiceAccountToken"] is False and "serviceAccountName" not in pod
    assert pod["securityContext"] == {"runAsNonRoot": True, "runAsUser": C.POD_UID, "runAsGroup": C.POD_GID,
                                      "fsGroup": C.POD_GID, "seccompProfile": {"type": "RuntimeDefault"}}
    assert pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True


def test_the_override_example_in_the_install_docs_is_valid_and_stays_restricted():
    import re
    from pathlib import Path

    import yaml

    docs = (Path(__file__).resolve().parents[3] / "docs" / "install.md").read_text()
    section = docs.split("### Your own trainer image", 1)[1]
    example = yaml.safe_load(re.search(r"```yaml\n(.*?)```", section, re.DOTALL).group(1))["spec"]
    assert validate_spec(make_spec(**example)) == []
    pods = rendered_pods(example)
    assert {name: violations(pod) for name, pod in pods.items()} == {name: [] for name in pods}
    assert pods["mlp-node-0"]["spec"]["securityContext"]["runAsUser"] == 1000
