"""The node container's working directory (render.launch.working_dir): a script job works on the
snapshot volume, so files it saves relative to its working directory outlive the pod."""
from __future__ import annotations

import pytest

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.job_ref import JobRef
from ddpjob_operator.api.validation import parse_spec
from ddpjob_operator.render.launch import working_dir
from ddpjob_operator.render.node_pod import render_pod
from ddpjob_sandbox.jobs import make_spec
from ddpjob_sandbox.node.launch import claim_dir, container_launch

CLAIM = {"mountPath": "/snapshots", "volume": {"persistentVolumeClaim": {"claimName": "tut-snapshots"}}}
REF = JobRef(name="tut", namespace="team-a", uid="6f1c2a9e-0000-4000-8000-000000000001", generation=1)


@pytest.mark.parametrize("fields, expected", [
    ({"module": None, "script": "/w/train.py", "snapshot": CLAIM}, "/snapshots/work"),
    ({"module": None, "script": "/w/train.py", "snapshot": {"mountPath": "/data",
                                                           "volume": {"emptyDir": {}}}}, "/data/work"),
    ({"module": None, "script": "train.py", "snapshot": CLAIM}, None),  # resolved against the image's directory: kept
    ({"snapshot": CLAIM}, None),  # python -m: sys.path starts with the image's working directory
    ({"module": None, "script": "/w/train.py"}, None),  # nothing outlives the pod
])
def test_only_an_absolute_script_with_a_snapshot_volume_moves_the_working_directory(fields, expected):
    spec = parse_spec(make_spec(**fields))
    assert working_dir(spec) == expected
    container = render_pod(REF, spec, 1)["spec"]["containers"][0]
    assert container.get("workingDir") == expected


def test_every_node_of_a_job_and_its_replacements_share_the_directory_on_the_claim(tmp_path):
    spec = parse_spec(make_spec(module=None, script="/w/train.py", snapshot=CLAIM))
    claim = "tut-snapshots"
    for index in (0, 1):
        pod = render_pod(REF, spec, index)
        pod["metadata"]["uid"] = f"pod-uid-{index}"  # as the API server assigns it
        launch = container_launch(pod, tmp_path, [], {})
        # The job's own directory of the claim (the mount's subPath is the job's name).
        assert launch.cwd == claim_dir(tmp_path, REF.namespace, claim) / "tut" / "work"
        assert launch.env[C.ENV_SNAPSHOT_DIR] == str(claim_dir(tmp_path, REF.namespace, claim) / "tut")
