"""The size of a DDPJob against the real kube-apiserver: `kubectl scale` and edits of minReplicas or
maxReplicas may not leave the --nnodes MIN:MAX the job's torchrun agents were started with.

The refusal comes from the CRD's transition rule (spec.py `_size_rule`), which the API server runs
on every update, the scale subresource's included; each test reads the job back to show that a
refused change left nothing behind. tests/operator/api/test_crd_cel.py runs the same rule with
cel-python over more cases.
"""
from __future__ import annotations

import pytest

from ddpjob_sandbox.client import ApiError, KubeClient
from ddpjob_sandbox.jobs import make_manifest
from tests.cluster.crds import chart_crd, install_crd

pytestmark = pytest.mark.cluster

SIZE_RULE = "may not change once the job exists"


@pytest.fixture(scope="module")
def installed(control_plane):
    return install_crd(control_plane.client(), chart_crd())


def spec_of(kube: KubeClient, name: str) -> dict:
    return kube.get("ddpjobs", name)["spec"]


def scale(kube: KubeClient, name: str, replicas: int):
    return kube.kubectl("scale", f"ddpjob/{name}", f"--replicas={replicas}", check=False)


def test_kubectl_scale_of_a_job_created_without_min_and_max_is_refused_with_both_sizes(installed, kube):
    kube.create("ddpjobs", make_manifest("fixed", replicas=3))
    before = spec_of(kube, "fixed")

    result = scale(kube, "fixed", 5)

    assert result.returncode != 0
    assert ("spec.replicas (5) may not change from 3: the job has no spec.elasticPolicy.minReplicas or "
            "maxReplicas, so its torchrun agents were started with --nnodes 3:3 (both default to spec.replicas); "
            "delete and recreate the job with the minReplicas and maxReplicas it may be scaled within") \
        in result.stderr, result.stderr
    assert spec_of(kube, "fixed") == before
    assert kube.get("ddpjobs", "fixed", subresource="scale")["spec"]["replicas"] == 3


def test_kubectl_scale_within_the_range_is_accepted_and_beyond_it_refused_naming_the_max(installed, kube):
    kube.create("ddpjobs", make_manifest("elastic", replicas=2, elasticPolicy={"minReplicas": 1, "maxReplicas": 4}))

    assert scale(kube, "elastic", 4).returncode == 0
    assert spec_of(kube, "elastic")["replicas"] == 4
    assert scale(kube, "elastic", 1).returncode == 0
    assert spec_of(kube, "elastic")["replicas"] == 1

    refused = scale(kube, "elastic", 5)
    assert refused.returncode != 0
    assert "spec.replicas (5) must be <= spec.elasticPolicy.maxReplicas (4)" in refused.stderr, refused.stderr
    assert spec_of(kube, "elastic")["replicas"] == 1


def test_the_scale_subresource_itself_refuses_with_422_and_the_rule(installed, kube):
    """What an HPA or any client of /scale meets, without kubectl in between."""
    kube.create("ddpjobs", make_manifest("hpa", replicas=2))
    with pytest.raises(ApiError) as refused:
        kube.patch("ddpjobs", "hpa", {"spec": {"replicas": 3}}, subresource="scale")
    assert refused.value.status == 422
    assert "spec.replicas (3) may not change from 2" in refused.value.body["message"], refused.value.body
    assert spec_of(kube, "hpa")["replicas"] == 2


@pytest.mark.parametrize("elastic_policy,shown", [
    ({"minReplicas": 2, "maxReplicas": 5}, "(2:5) may not change from 3:3"),
    ({"maxReplicas": 5}, "(4:5) may not change from 3:3"),  # minReplicas defaults to the new replicas
])
def test_adding_min_or_max_replicas_to_a_created_job_is_refused_and_nothing_is_applied(
        installed, kube, elastic_policy, shown):
    kube.create("ddpjobs", make_manifest("later", replicas=3))
    before = spec_of(kube, "later")

    with pytest.raises(ApiError) as refused:  # with replicas too: the whole patch is refused, not half of it
        kube.patch("ddpjobs", "later", {"spec": {"replicas": 4, "elasticPolicy": elastic_policy}})

    assert refused.value.status == 422
    assert f"spec.elasticPolicy minReplicas:maxReplicas {shown}, the --nnodes its torchrun agents were " \
           "started with" in refused.value.body["message"], refused.value.body
    assert spec_of(kube, "later") == before


def test_changing_max_replicas_of_an_elastic_job_with_kubectl_patch_is_refused(installed, kube):
    kube.create("ddpjobs", make_manifest("grow", replicas=2, elasticPolicy={"minReplicas": 1, "maxReplicas": 4}))
    before = spec_of(kube, "grow")

    result = kube.kubectl("patch", "ddpjob/grow", "--type=merge",
                          "-p", '{"spec": {"elasticPolicy": {"maxReplicas": 8}}}', check=False)

    assert result.returncode != 0
    assert "spec.elasticPolicy minReplicas:maxReplicas (1:8) may not change from 1:4" in result.stderr, result.stderr
    assert spec_of(kube, "grow") == before


def test_writing_out_the_defaulted_range_is_accepted(installed, kube):
    """minReplicas: 3, maxReplicas: 3 is what a job of replicas: 3 already runs with: no change."""
    kube.create("ddpjobs", make_manifest("explicit", replicas=3))
    kube.patch("ddpjobs", "explicit", {"spec": {"elasticPolicy": {"minReplicas": 3, "maxReplicas": 3}}})
    assert spec_of(kube, "explicit")["elasticPolicy"]["maxReplicas"] == 3
