"""End to end in the sandbox with the rendezvous in a real etcd (manifests/examples/ddpjob-etcd.yaml),
and which etcd that is: the pinned 3.6 for ddpjob's etcd-v3 (no v2 API), Debian's 3.4 with the v2
API only for torch's own etcd backend; a missing pinned etcd fails, naming the command that builds it.

Test-speed overrides on a copy of the example (besides those of ``example_job``): 2 replicas
instead of 3 and a CPU request of 1 (nProcPerNode auto then runs one worker per node instead of
the example's two; more torch processes would crowd 2 cores), fewer samples and epochs, a step
sleep, and rdzvEndpoints pointing at the test's etcd through a Service-style DNS name
(``ddpjob-etcd.<ns>.svc:<port>``; the sandbox node resolves it to loopback). minReplicas
stays 2, so a lost node's replacement must join before training goes on.
"""
from __future__ import annotations

import pytest

from ddpjob_operator.api import constants as C
from tests.support.elastic_checks import assert_ran_exactly_once, assert_resumed_from_snapshots, world_size_phases
from ddpjob_sandbox.jobs import job_snapshot_dir
from ddpjob_sandbox.binaries import MissingBinaryError
from ddpjob_sandbox.etcd import V2, api_for_backend, running_etcd
from ddpjob_sandbox.readers import events
from ddpjob_sandbox.metrics import JobProgress, is_event
from ddpjob_sandbox.examples import example_job, kubectl_apply, trainer_args

EPOCHS = 6
SNAPSHOT_EVERY = 4  # optimizer steps (each accumulates 2 micro-batches, as in the example)


@pytest.fixture
def etcd(backend):
    """etcd 3.6 for ddpjob's etcd-v3, Debian's 3.4 with the v2 API for torch's etcd backend."""
    with running_etcd(api=api_for_backend(backend)) as server:
        yield server


@pytest.mark.parametrize(("backend", "release", "v2_api"), [("etcd-v3", "3.6.", False), ("etcd", "3.4.", True),
                                                         ("etcd-v2", "3.4.", True)])
def test_each_backend_gets_the_etcd_release_it_is_meant_for(backend, release, v2_api):
    with running_etcd(api=api_for_backend(backend)) as server:
        assert server.get("/version")["etcdserver"].startswith(release)
        try:
            server.get("/v2/keys/")
            served = True
        except OSError:  # urllib's HTTPError (404 on 3.6, where the v2 API is gone) is an OSError
            served = False
        assert served is v2_api


def test_a_missing_pinned_etcd_fails_naming_the_command_that_builds_it(tmp_path):
    with pytest.raises(MissingBinaryError, match=r"etcd not found in .*: build it with make cluster-binaries"):
        with running_etcd(bin_dir=tmp_path):
            pass


def test_a_missing_debian_etcd_for_torchs_v2_backend_names_its_install_script(monkeypatch, tmp_path):
    monkeypatch.setattr("ddpjob_sandbox.binaries.DEBIAN_BIN_DIR", tmp_path)
    with pytest.raises(MissingBinaryError, match=r"install it with scripts/install-system-deps.sh"):
        with running_etcd(api=V2):
            pass


@pytest.mark.slow  # ~70 s each: the kill waits for the replacement (minReplicas 2)
@pytest.mark.parametrize("backend", ["etcd-v3", "etcd"])
def test_a_killed_node_rejoins_through_etcd_and_the_other_node_keeps_its_pod(backend, k8s, operator, node_agent,
                                                                           etcd, tmp_path):
    args = trainer_args(epochs=EPOCHS, samples=4096, batch_size=64, step_sleep=0.15,
                        snapshot_every_steps=SNAPSHOT_EVERY, extra=("--accumulation-steps", "2"))
    body = example_job("ddpjob-etcd.yaml", args=args)
    body["spec"]["replicas"] = 2
    body["spec"]["resources"]["requests"] = {"cpu": "1"}
    body["spec"]["elasticPolicy"].update(rdzvBackend=backend,
                                         rdzvEndpoints=[f"ddpjob-etcd.{k8s.namespace}.svc:{etcd.port}"])
    kubectl_apply(k8s, body, tmp_path)
    job = body["metadata"]["name"]
    claim = body["spec"]["snapshot"]["volume"]["persistentVolumeClaim"]["claimName"]
    progress = JobProgress(k8s, node_agent, job, job_snapshot_dir(node_agent.claim_dir(claim), job) / "metrics.jsonl")

    progress.wait(is_event("start", world_size=2), 120, "both nodes training")
    snapshot = progress.wait(is_event("snapshot", step=lambda s: s >= 2 * SNAPSHOT_EVERY), 60, "a snapshot")
    survivor = node_agent.current(f"{job}-node-1")
    killed = node_agent.kill(f"{job}-node-0")  # no node hosts the rendezvous: any may go
    resumed = progress.wait(is_event("start"), 120, "training resumed with the replacement")
    node_agent.wait_for_container(f"{job}-node-0", 5, other_than=killed.uid)
    status = progress.wait_phase(C.PHASE_SUCCEEDED, 120)

    raw = assert_ran_exactly_once(progress.metrics_path, EPOCHS)
    assert assert_resumed_from_snapshots(raw), "no restart after the kill"
    assert resumed["world_size"] == 2 and resumed["resume_step"] >= snapshot["step"]
    assert set(world_size_phases(raw)) == {2}, "minReplicas 2: never trained with one node"
    assert survivor.exit_code == 0 and node_agent.current(f"{job}-node-1") is survivor, \
        "the surviving pod kept running: losing a node is no whole-group restart with etcd"
    assert status["restarts"] == 1
    assert any(f"node pod {job}-node-0 failed (exit code 137, Error)" in m for _, _, m in events(k8s, job))
