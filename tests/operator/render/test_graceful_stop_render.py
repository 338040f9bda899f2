"""spec.snapshot.gracefulStopSeconds: the pods' grace period, and torchrun's clock inside it."""

from __future__ import annotations

import pytest

from ddpjob_operator.api.job_ref import JobRef
from ddpjob_operator.api.validation import InvalidSpecError, parse_spec
from ddpjob_operator.render.launch import shutdown_timeout
from ddpjob_operator.render.node_pod import render_pod
from ddpjob_sandbox.jobs import make_spec

REF = JobRef(name="mlp", namespace="team-a", uid="6f1c2a9e-0000-4000-8000-000000000001", generation=1)


def pod(**fields):
    return render_pod(REF, parse_spec(make_spec(**fields)), 0)


def env_of(rendered):
    return {e["name"]: e.get("value") for e in rendered["spec"]["containers"][0]["env"]}


@pytest.mark.parametrize("snapshot, grace, timeout", [({}, 30, "28"), ({"gracefulStopSeconds": 90}, 90, "88")])
def test_a_job_with_snapshots_gets_the_grace_period_and_torchrun_stops_its_workers_just_inside_it(
        snapshot, grace, timeout):
    rendered = pod(snapshot=snapshot)
    assert rendered["spec"]["terminationGracePeriodSeconds"] == grace
    assert env_of(rendered)["PET_SHUTDOWN_TIMEOUT"] == timeout


def test_without_snapshots_nothing_can_be_saved_and_the_cluster_defaults_stay():
    rendered = pod()
    assert "terminationGracePeriodSeconds" not in rendered["spec"]
    assert "PET_SHUTDOWN_TIMEOUT" not in env_of(rendered)


def test_the_shutdown_timeout_never_reaches_zero():
    assert [shutdown_timeout(g) for g in (3, 4, 30)] == [1, 2, 28]


def test_a_grace_period_too_short_to_save_is_refused():
    with pytest.raises(InvalidSpecError) as raised:
        parse_spec(make_spec(snapshot={"gracefulStopSeconds": 1}))
    assert str(raised.value) == "invalid DDPJob: spec.snapshot.gracefulStopSeconds (1) must be >= 3"


def test_torchruns_shutdown_timeout_cannot_be_set_in_env():
    with pytest.raises(InvalidSpecError) as raised:
        parse_spec(make_spec(env=[{"name": "PET_SHUTDOWN_TIMEOUT", "value": "5"}]))
    assert "spec.snapshot.gracefulStopSeconds" in str(raised.value)
