"""A volumeMount's subPath on the sandbox node: the mount sees that directory of its volume, which
the node creates as the kubelet does; a subPath that would leave its volume is refused."""
from __future__ import annotations

import pytest

from ddpjob_sandbox.node.launch import UnsupportedPodError, container_launch, mounts, volume_dirs


def pod_with_subpath(sub: str) -> dict:
    container = {"name": "trainer", "image": "sandbox", "command": ["python", "-c", "pass"],
                 "env": [{"name": "DDPJOB_SNAPSHOT_DIR", "value": "/snapshots"}],
                 "volumeMounts": [{"name": "snapshots", "mountPath": "/snapshots", "subPath": sub}]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "mlp-node-0", "namespace": "ns", "uid": "u-0"},
            "spec": {"restartPolicy": "Never", "containers": [container],
                     "volumes": [{"name": "snapshots", "persistentVolumeClaim": {"claimName": "shared"}}]}}


def test_two_jobs_on_one_claim_see_their_own_directories_of_it(tmp_path):
    seen = set()
    for job in ("pretrain", "finetune"):
        launch = container_launch(pod_with_subpath(job), tmp_path, [], {"PATH": "/bin"})
        seen.add(launch.env["DDPJOB_SNAPSHOT_DIR"])
    claim = tmp_path / "claims" / "ns" / "shared"
    assert seen == {str(claim / "pretrain"), str(claim / "finetune")}


def test_the_subpath_directory_is_what_the_node_creates(tmp_path):
    pod = pod_with_subpath("mlp")
    (pair,) = [p for p in mounts(pod["spec"]["containers"][0], volume_dirs(pod, tmp_path)) if p[0] == "/snapshots"]
    assert pair[1] == tmp_path / "claims" / "ns" / "shared" / "mlp"


@pytest.mark.parametrize("sub", ["../other-team", "/etc", "a/../../b"])
def test_a_subpath_that_leaves_its_volume_is_refused(tmp_path, sub):
    with pytest.raises(UnsupportedPodError, match=r"subPath .*relative path without '\.\.'"):
        container_launch(pod_with_subpath(sub), tmp_path, [], {"PATH": "/bin"})
