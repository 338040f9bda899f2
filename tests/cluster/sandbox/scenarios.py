"""The whole-loop scenarios of this folder: a DDPJob of the shared helm-installed operator
(tests/cluster/operators.py) trained by real torchrun on the kubelets' Nodes, followed through
its metrics file on its own snapshot claim.

:class:`Sandbox` (the fixture ``sandbox``) is what such a test holds: the operator's namespace,
a job name of the test's own (earlier tests' pods and Events never match it), the containers
of that namespace across the kubelets, and a claim per job bound to a hostPath volume of the
test's, so a job never resumes from another's snapshots.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ddpjob_sandbox.jobs import job_snapshot_dir
from ddpjob_sandbox.client import ApiError, KubeClient
from ddpjob_sandbox.control_plane import ControlPlane
from ddpjob_sandbox.control_plane.cluster import volume_body
from ddpjob_sandbox.control_plane.kubelets import Containers, Kubelet, joining_kubelet
from ddpjob_sandbox.examples import kubectl_apply
from ddpjob_sandbox.metrics import JobProgress
from tests.cluster.conftest import HEARTBEAT_SECONDS
from tests.cluster.installed_operator import OPERATOR_READY_SECONDS, example_body
from tests.cluster.operators import Operated

# pytest's timeout for one of these tests: the suite's 300 s of training and waits, plus what its
# setup may pay first (the control plane starting and a helm install of the operator it asks for).
TEST_SECONDS = 300 + 60 + OPERATOR_READY_SECONDS
# An extended resource (as a GPU is) that only a test's own Nodes have (Sandbox.join_node): a job
# whose node pods ask one each (with_slot) runs one pod per such Node, and no pod elsewhere.
SLOT = "example.com/slot"


def with_slot(spec: dict) -> None:
    """The example's resources, plus one SLOT per node pod."""
    spec["resources"] = {"requests": {**spec["resources"]["requests"], SLOT: "1"},
                         "limits": {**spec["resources"]["limits"], SLOT: "1"}}


@dataclass
class Sandbox:
    operated: Operated
    nodes: Containers
    workdir: Path
    control_plane: ControlPlane
    volumes: list[str] = field(default_factory=list)

    @property
    def kube(self) -> KubeClient:
        return self.operated.kube

    @property
    def job(self) -> str:
        return self.operated.job

    def join_node(self, name: str) -> contextlib.AbstractContextManager[Kubelet]:
        """Node ``<job>-<name>`` with one SLOT, its kubelet running for the block (joining_kubelet);
        its pods' containers are among ``nodes``'."""
        kubelet = joining_kubelet(self.kube, self.control_plane.layout.pki, self.control_plane.url,
                                  f"{self.job}-{name}", self.workdir / "nodes" / name, capacity={SLOT: "1"},
                                  heartbeat_seconds=HEARTBEAT_SECONDS, poll_seconds=0.2)
        return _joined(kubelet, self.nodes)

    def claim(self, job: str) -> str:
        """A snapshot claim of job ``job``'s own, bound to a new hostPath volume under the workdir."""
        claim, volume = f"{job}-snapshots", f"{self.kube.namespace}-{job}"
        self.kube.create("persistentvolumes", volume_body(volume, self.workdir / "volumes" / job))
        self.volumes.append(volume)
        self.kube.create("persistentvolumeclaims", {"metadata": {"name": claim}, "spec": {
            "accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": volume,
            "resources": {"requests": {"storage": "1Gi"}}}})
        return claim

    def body(self, args: list[str], *, rdzv_store: str | None = "node", job: str | None = None) -> dict:
        """The test-speed c10d example (example_job) as DDPJob ``job`` (the test's own name by
        default) on the kubelets' Nodes, on a claim of its own; ``rdzv_store`` set unless None
        (the example's then)."""
        job = job or self.job
        body = example_body(job, args)
        if rdzv_store is not None:
            body["spec"]["elasticPolicy"]["rdzvStore"] = rdzv_store
        body["spec"]["snapshot"]["volume"] = {"persistentVolumeClaim": {"claimName": self.claim(job)}}
        return body

    def apply(self, body: dict) -> JobProgress:
        """`kubectl apply` of ``body``, followed through its metrics file."""
        kubectl_apply(self.kube, body, self.workdir)
        return self.progress(body)

    def progress(self, body: dict) -> JobProgress:
        claim = body["spec"]["snapshot"]["volume"]["persistentVolumeClaim"]["claimName"]
        name = body["metadata"]["name"]
        metrics = job_snapshot_dir(self.nodes.claim_dir(claim), name) / "metrics.jsonl"
        return JobProgress(self.kube, self.nodes, name, metrics)

    def start_job(self, *, args: list[str], rdzv_store: str | None = "node", edit: Callable[[dict], None] | None = None,
                  job: str | None = None) -> tuple[JobProgress, dict]:
        """Applies the test-speed example (``edit`` changes its spec further) and follows it;
        returns the follower and the applied body."""
        body = self.body(args, rdzv_store=rdzv_store, job=job)
        if edit is not None:
            edit(body["spec"])
        return self.apply(body), body

    def close(self) -> None:
        """Deletes the claims and volumes (each goes once no pod uses it)."""
        for volume in self.volumes:
            job = volume.removeprefix(f"{self.kube.namespace}-")
            for resource, name, namespace in (("persistentvolumeclaims", f"{job}-snapshots", self.kube.namespace),
                                              ("persistentvolumes", volume, None)):
                with contextlib.suppress(ApiError):  # 404: gone already
                    self.kube.request("DELETE", self.kube.path(resource, name, namespace))


@contextlib.contextmanager
def _joined(joining: contextlib.AbstractContextManager[Kubelet], nodes: Containers):
    with joining as kubelet:
        nodes.kubelets.append(kubelet)
        yield kubelet
