"""End to end on the real control plane with `elasticPolicy.rdzvStore: pod`: the helm-installed
operator creates the store pod (`python -m ddpjob_trainer.store_server`), real torchrun agents
join it with is_host=false, and losing node 0 costs only node 0: the other agent keeps running,
re-rendezvouses, resumes from the snapshot and the replacement joins under the same id;
losing the store pod restarts the whole group under the next rendezvous generation."""
from __future__ import annotations

import pytest

from ddpjob_operator.api import constants as C
from tests.cluster.sandbox.scenarios import TEST_SECONDS, Sandbox
from tests.support.elastic_checks import assert_ran_exactly_once, assert_resumed_from_snapshots
from ddpjob_sandbox.readers import events
from ddpjob_sandbox.metrics import JobProgress, is_event
from ddpjob_sandbox.examples import trainer_args

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(TEST_SECONDS)]

EPOCHS = 3
SNAPSHOT_EVERY = 10
START_TIMEOUT = 150  # store + 2 agents + 2 workers importing torch on 2 shared cores


def start_store_pod_job(sandbox: Sandbox) -> tuple[JobProgress, int]:
    args = trainer_args(epochs=EPOCHS, samples=2048, step_sleep=0.1, snapshot_every_steps=SNAPSHOT_EVERY)
    progress, body = sandbox.start_job(args=args, rdzv_store="pod")  # pod: the c10d default
    return progress, body["spec"]["elasticPolicy"]["rdzvPort"]


@pytest.mark.slow  # ~70 s of real training on two shared cores
def test_with_a_store_pod_losing_node_0_keeps_the_other_agent_and_resumes_to_success(sandbox: Sandbox):
    nodes, job = sandbox.nodes, sandbox.job
    progress, port = start_store_pod_job(sandbox)
    progress.wait(is_event("start", world_size=2), START_TIMEOUT, "both nodes training through the store pod")
    assert nodes.pod_listening_on(port) == f"{job}-rdzv", "the store pod, not a node, must hold the store"
    snapshot = progress.wait(is_event("snapshot", step=lambda s: s >= 2 * SNAPSHOT_EVERY), 60, "a mid-epoch snapshot")
    survivor = nodes.current(f"{job}-node-1")
    killed = nodes.kill(f"{job}-node-0")

    resumed = progress.wait(is_event("start"), 60, "training restarting without node 0")
    replacement = nodes.wait_for_container(f"{job}-node-0", 30, other_than=killed.uid)
    status = progress.wait_phase(C.PHASE_SUCCEEDED, 150)

    raw = assert_ran_exactly_once(progress.metrics_path, EPOCHS)
    assert assert_resumed_from_snapshots(raw), "no restart after the kill"
    assert resumed["resume_step"] >= snapshot["step"]
    # The survivor's agent lived through it: the same process exited 0 at the end.
    assert nodes.current(f"{job}-node-1").uid == survivor.uid and survivor.exit_code == 0
    assert replacement.exit_code == 0
    assert status["restarts"] == 1 and status.get("rendezvousGeneration") is None


@pytest.mark.slow  # ~90 s: the whole group starts again
def test_losing_the_store_pod_restarts_the_group_under_a_new_id_and_resumes_to_success(sandbox: Sandbox):
    k8s, nodes, job = sandbox.kube, sandbox.nodes, sandbox.job
    progress, port = start_store_pod_job(sandbox)
    progress.wait(is_event("start", world_size=2), START_TIMEOUT, "both nodes training through the store pod")
    snapshot = progress.wait(is_event("snapshot", step=lambda s: s >= 2 * SNAPSHOT_EVERY), 60, "a mid-epoch snapshot")
    old_store = nodes.kill(f"{job}-rdzv")

    nodes.wait_for_container(f"{job}-rdzv", 60, other_than=old_store.uid)
    resumed = progress.wait(is_event("start", world_size=2), START_TIMEOUT, "the new group training")
    status = progress.wait_phase(C.PHASE_SUCCEEDED, 150)

    raw = assert_ran_exactly_once(progress.metrics_path, EPOCHS)
    assert assert_resumed_from_snapshots(raw), "no restart after the store's loss"
    assert resumed["resume_step"] >= snapshot["step"]
    assert (status["rendezvousGeneration"], status["restarts"]) == (1, 1)
    uid = k8s.get("ddpjobs", job)["metadata"]["uid"]
    assert all(nodes.current(f"{job}-node-{i}").exit_code == 0 for i in range(2))
    warnings = [(r, m) for kind, r, m in events(k8s, job) if kind == C.EVENT_WARNING]
    assert [r for r, _ in warnings].count(C.REASON_GROUP_RESTART) == 1, warnings
    for name in (f"{job}-node-0", f"{job}-node-1"):
        pod = k8s.get("pods", name)
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        assert (env["PET_RDZV_ID"], pod["metadata"]["labels"][C.LABEL_RDZV_GENERATION]) == (f"{uid}-1", "1")
