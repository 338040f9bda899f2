"""The chart's optional shared etcd (etcd.enabled): off by default, a valid one-member StatefulSet + Service."""
from __future__ import annotations

import pytest

from tests.charts.support import NAMESPACE, by_kind, one, render, render_notes

ON = {"etcd": {"enabled": True}}


def etcd_container(objects: list[dict]) -> dict:
    return one(objects, "StatefulSet")["spec"]["template"]["spec"]["containers"][0]


def test_off_by_default():
    objects = render()
    assert by_kind(objects, "StatefulSet") == []
    assert [s for s in by_kind(objects, "Service") if s["metadata"]["name"].endswith("-etcd")] == []
    assert "Shared etcd" not in render_notes()


def test_on_renders_one_member_and_a_service_that_selects_it():
    objects = render(ON)
    statefulset, service = one(objects, "StatefulSet"), one(objects, "Service")

    assert statefulset["spec"]["replicas"] == 1
    assert service["metadata"]["name"] == statefulset["spec"]["serviceName"] == statefulset["metadata"]["name"]
    pod_labels = statefulset["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert statefulset["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert service["spec"]["ports"][0]["port"] == 2379


def test_the_operator_deployment_never_selects_the_etcd_pod():
    objects = render(ON)
    operator_selector = one(objects, "Deployment")["spec"]["selector"]["matchLabels"]
    etcd_pod_labels = one(objects, "StatefulSet")["spec"]["template"]["metadata"]["labels"]
    assert not operator_selector.items() <= etcd_pod_labels.items()


def test_the_endpoint_in_the_notes_is_the_service_and_the_advertised_url():
    objects = render(ON)
    name = one(objects, "Service")["metadata"]["name"]
    endpoint = f"{name}.{NAMESPACE}.svc:2379"

    assert f'rdzvEndpoints: ["{endpoint}"]' in render_notes(ON)
    assert f"--advertise-client-urls=http://{endpoint}" in etcd_container(objects)["args"]


@pytest.mark.parametrize(("enable_v2", "flag_present"), [(False, False), (True, True)])
def test_the_v2_api_only_when_asked(enable_v2, flag_present):
    args = etcd_container(render({"etcd": {"enabled": True, "enableV2": enable_v2}}))["args"]
    assert ("--enable-v2=true" in args) is flag_present


def test_etcd_pod_is_hardened_like_the_operator():
    objects = render(ON)
    pod = one(objects, "StatefulSet")["spec"]["template"]["spec"]
    container = etcd_container(objects)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}}
    assert {"name": "data", "mountPath": "/var/lib/etcd"} in container["volumeMounts"]
    assert pod["automountServiceAccountToken"] is False  # etcd never calls the Kubernetes API


def test_a_long_release_name_keeps_the_etcd_name_within_63_characters():
    objects = render(ON, name="a" * 40 + "-training-team")
    name = one(objects, "StatefulSet")["metadata"]["name"]
    assert len(name) <= 63 and name.endswith("-etcd") and "--" not in name
