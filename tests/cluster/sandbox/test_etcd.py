"""End to end on the real control plane with the rendezvous in a real etcd
(manifests/examples/ddpjob-etcd.yaml): the pinned 3.6 for ddpjob's etcd-v3 (no v2 API), Debian's
3.4 with the v2 API for torch's own etcd backend (tests/sandbox/test_etcd.py: which is which).

Test-speed overrides on a copy of the example (besides those of ``example_job``): 2 replicas
instead of 3 and a CPU request of 1 (nProcPerNode auto then runs one worker per node instead of
the example's two; more torch processes would crowd 2 cores), fewer samples and epochs, a step
sleep, and rdzvEndpoints pointing at the test's etcd through a Service-style DNS name
(``ddpjob-etcd.<ns>.svc:<port>``; no such Service selects a pod, so the kubelets resolve it
to this machine's loopback), under the test's job name and on a snapshot claim of its own.
minReplicas stays 2, so a lost node's replacement must join before training goes on.
"""
from __future__ import annotations

import pytest

from ddpjob_operator.api import constants as C
from tests.support.elastic_checks import assert_ran_exactly_once, assert_resumed_from_snapshots, world_size_phases
from ddpjob_sandbox.control_plane.kubelets import NODE_LABEL
from ddpjob_sandbox.etcd import api_for_backend, running_etcd
from ddpjob_sandbox.readers import events
from ddpjob_sandbox.metrics import is_event
from ddpjob_sandbox.examples import example_job, trainer_args
from tests.cluster.sandbox.scenarios import TEST_SECONDS, Sandbox

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(TEST_SECONDS)]

EPOCHS = 6
SNAPSHOT_EVERY = 4  # optimizer steps (each accumulates 2 micro-batches, as in the example)


@pytest.fixture
def etcd(backend):
    """etcd 3.6 for ddpjob's etcd-v3, Debian's 3.4 with the v2 API for torch's etcd backend."""
    with running_etcd(api=api_for_backend(backend)) as server:
        yield server


@pytest.mark.slow  # ~70 s each: the kill waits for the replacement (minReplicas 2)
@pytest.mark.parametrize("backend", ["etcd-v3", "etcd"])
def test_a_killed_node_rejoins_through_etcd_and_the_other_node_keeps_its_pod(backend, sandbox: Sandbox, etcd):
    k8s, nodes = sandbox.kube, sandbox.nodes
    args = trainer_args(epochs=EPOCHS, samples=4096, batch_size=64, step_sleep=0.15,
                        snapshot_every_steps=SNAPSHOT_EVERY, extra=("--accumulation-steps", "2"))
    body = example_job("ddpjob-etcd.yaml", args=args)
    body["metadata"]["name"] = sandbox.job
    body["spec"]["scheduling"] = {"nodeSelector": {NODE_LABEL: "true"}}
    body["spec"]["snapshot"]["volume"] = {"persistentVolumeClaim": {"claimName": sandbox.claim(sandbox.job)}}
    body["spec"]["replicas"] = 2
    body["spec"]["resources"]["requests"] = {"cpu": "1"}
    body["spec"]["elasticPolicy"].update(rdzvBackend=backend,
                                         rdzvEndpoints=[f"ddpjob-etcd.{k8s.namespace}.svc:{etcd.port}"])
    progress = sandbox.apply(body)
    job = sandbox.job

    progress.wait(is_event("start", world_size=2), 120, "both nodes training")
    snapshot = progress.wait(is_event("snapshot", step=lambda s: s >= 2 * SNAPSHOT_EVERY), 60, "a snapshot")
    survivor = nodes.current(f"{job}-node-1")
    killed = nodes.kill(f"{job}-node-0")  # no node hosts the rendezvous: any may go
    resumed = progress.wait(is_event("start"), 120, "training resumed with the replacement")
    nodes.wait_for_container(f"{job}-node-0", 5, other_than=killed.uid)
    status = progress.wait_phase(C.PHASE_SUCCEEDED, 120)

    raw = assert_ran_exactly_once(progress.metrics_path, EPOCHS)
    assert assert_resumed_from_snapshots(raw), "no restart after the kill"
    assert resumed["world_size"] == 2 and resumed["resume_step"] >= snapshot["step"]
    assert set(world_size_phases(raw)) == {2}, "minReplicas 2: never trained with one node"
    assert survivor.exit_code == 0 and nodes.current(f"{job}-node-1") is survivor, \
        "the surviving pod kept running: losing a node is no whole-group restart with etcd"
    assert status["restarts"] == 1
    assert any(f"node pod {job}-node-0 failed (exit code 137, Error)" in m for _, _, m in events(k8s, job))
