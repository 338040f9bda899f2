"""A warm spare on the real control plane: a job of 2 nodes and spareReplicas 1 trains with the
third node pod parked in the rendezvous' redundancy list; a training node pod is deleted with grace
0 (what the pod GC does to the pods of a lost Node); the spare joins the survivor at once, the
survivors pause once (no round at reduced size, no backoff), the operator creates the lost pod
again at once as the new spare, free of the restart budget, and the job succeeds with every step
trained once in the example trainer's effective history."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from ddpjob_operator.api import constants as C
from ddpjob_sandbox.metrics import read_events, trains
from tests.cluster.installed_operator import (
    JOB_SECONDS, OPERATOR_READY_SECONDS, Installed, diagnosis, example_body, submit, wait, wait_finished,
)
from ddpjob_sandbox.examples import trainer_args
from ddpjob_sandbox.jobs import job_snapshot_dir
from tests.support.elastic_checks import assert_ran_exactly_once

pytestmark = pytest.mark.cluster

JOB = "spared"
EPOCHS = 3
# 192 steps of at least 0.2 s: the replacement has time to start and park as the new spare before the end.
ARGS = trainer_args(epochs=EPOCHS, samples=4096, step_sleep=0.2, snapshot_every_steps=8)
NODES = tuple(f"{JOB}-node-{i}" for i in range(3))


def job_status(installed: Installed) -> dict:
    return installed.kube.get("ddpjobs", JOB).get("status") or {}


def two_training(installed: Installed) -> list[str] | None:
    names = [n for n in NODES if trains(installed.kube, n)]
    return names if len(names) == 2 else None


def metrics_file(installed: Installed) -> Path:
    """The example trainer's metrics.jsonl in the job's own directory of the hostPath volume bound to its claim."""
    kube = installed.kube
    claim = installed.kube.get("persistentvolumeclaims",
                               kube.get("ddpjobs", JOB)["spec"]["snapshot"]["volume"]["persistentVolumeClaim"]
                               ["claimName"])
    volume = kube.get("persistentvolumes", claim["spec"]["volumeName"])
    return job_snapshot_dir(Path(volume["spec"]["hostPath"]["path"]), JOB) / "metrics.jsonl"


@pytest.mark.slow  # 3 node pods importing torch, a loss and a replacement (~2-3 min on a loaded 2-core machine)
@pytest.mark.timeout(OPERATOR_READY_SECONDS + 2 * JOB_SECONDS + 120)  # the control plane may start in setup
def test_a_spare_takes_a_lost_nodes_place_at_once_with_one_pause_and_a_new_spare_follows(installed: Installed):
    kube = installed.kube
    body = example_body(JOB, ARGS)
    body["spec"]["replicas"] = 2
    body["spec"]["elasticPolicy"].update(minReplicas=1, maxReplicas=2, spareReplicas=1)
    # minReplicas 1: the survivor alone could form a round; the spare must be waited for instead.
    submit(installed, body)
    wait(installed, lambda: (s := job_status(installed)).get("spares") == 1 and (s.get("lastSnapshot") or {})
         .get("step") and s.get("rendezvousReplicas") == 2, JOB_SECONDS, "a first snapshot with the spare waiting")
    assert job_status(installed)["phase"] == C.PHASE_RUNNING
    trainers = wait(installed, lambda: two_training(installed), 60, "the two training node pods serving their progress")
    (spare,) = set(NODES) - set(trainers)
    metrics = metrics_file(installed)
    seen = len(read_events(metrics))  # what the group wrote before the loss
    victim = kube.get("pods", trainers[-1])

    kube.delete("pods", victim["metadata"]["name"], gracePeriodSeconds=0)
    lost_at = time.monotonic()
    # The lost pod comes back at once (no backoff: the node lost it, the job's code did not fail) ...
    wait(installed, lambda: (p := kube.find("pods", victim["metadata"]["name"])) is not None
         and p["metadata"]["uid"] != victim["metadata"]["uid"], 30, "the lost node pod created again at once")
    # ... and parks as the new spare while the old spare trains.
    seen_states: list[tuple] = []

    def respared() -> bool:
        status = job_status(installed)
        state = (round(time.monotonic() - lost_at, 1), status.get("phase"), status.get("spares"),
                 status.get("rendezvousReplicas"), status.get("ready"),
                 {n: trains(installed.kube, n) for n in NODES},
                 {p["metadata"]["name"]: (p.get("status") or {}).get("phase") for p in kube.list("pods")})
        if not seen_states or seen_states[-1][1:] != state[1:]:
            seen_states.append(state)
        return status.get("spares") == 1 and status.get("rendezvousReplicas") == 2 and state[5][spare]

    try:
        wait(installed, respared, JOB_SECONDS, "the old spare training and the replacement waiting as the new spare")
    finally:
        print("after the loss (seconds, phase, spares, world size, ready, training, pods):", *seen_states,
              [e for e in read_events(metrics)[seen:] if e["event"] != "step"], sep="\n")
    assert job_status(installed)["phase"] == C.PHASE_RUNNING, "replaced mid-run, not after the end"

    status = wait_finished(installed, JOB)
    assert status["phase"] == C.PHASE_SUCCEEDED, f"{status}\n{diagnosis(kube, installed.kubelets)}"
    assert status.get("restarts", 0) == 0, f"a node lost to its node uses no restart of the budget: {status}"
    raw = assert_ran_exactly_once(metrics, EPOCHS)
    # One pause: the survivor and the spare formed one round of 2 (rank 0 writes one start event
    # per round); a round at reduced size, then a second one, would show as two starts.
    after = raw[seen:]
    starts = [e for e in after if e["event"] == "start"]
    assert [s["world_size"] for s in starts] == [2], starts
    assert {e["world_size"] for e in after if e["event"] == "step"} == {2}, "every step after the loss trained by 2"
