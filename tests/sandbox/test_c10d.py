"""End to end in the sandbox: ``kubectl apply`` of the c10d example, the real operator, real
torchrun and real training of the example MLP on the sandbox node; then faults.

Test-speed overrides (see ``tests.support.sandbox.example_job``): a copy of
manifests/examples/ddpjob-c10d.yaml is applied with fewer samples, ``--step-sleep`` and
``--snapshot-every-steps`` in the trainer args, one worker per node, a free rendezvous port,
short rdzvTimeouts (3 s last call, 2 s x 3 keep-alive) and a 1 s replacement backoff.
Everything else (replicas 2, minReplicas 1, maxReplicas 4, the snapshot claim, the failure
policy's budget and permanent codes) is the example's.
"""
from __future__ import annotations

import time

from ddpjob_operator import constants as C
from tests.support.elastic_checks import assert_ran_exactly_once, assert_resumed_from_snapshots, world_size_phases
from tests.support.kubelet import events
from tests.support.operator_harness import cluster, k8s, operator  # noqa: F401  (fixtures)
from tests.support.procs import free_port
from tests.support.sandbox import JobProgress, example_job, kubectl_apply, node_agent, trainer_args  # noqa: F401
from tests.support.torchrun import is_event

EPOCHS = 4
SNAPSHOT_EVERY = 10
START_TIMEOUT = 120  # operator + 2 torchrun agents + 2 workers importing torch on 2 shared cores


def start_example(k8s, node_agent, tmp_path, *, epochs: int = EPOCHS, samples: int = 2048,
                  step_sleep: float = 0.1, extra: tuple[str, ...] = ()) -> tuple[JobProgress, int]:
    port = free_port()
    args = trainer_args(epochs=epochs, samples=samples, step_sleep=step_sleep,
                        snapshot_every_steps=SNAPSHOT_EVERY, extra=extra)
    body = example_job(args=args, rdzv_port=port)
    kubectl_apply(k8s, body, tmp_path)
    claim = body["spec"]["snapshot"]["volume"]["persistentVolumeClaim"]["claimName"]
    progress = JobProgress(k8s, node_agent, "mlp", node_agent.claim_dir(claim) / "metrics.jsonl")
    return progress, port


def other_node(host: str) -> str:
    return "mlp-node-1" if host == "mlp-node-0" else "mlp-node-0"


def test_a_killed_node_is_replaced_and_training_resumes_from_the_snapshot_to_success(k8s, operator, node_agent,
                                                                                    tmp_path):
    progress, port = start_example(k8s, node_agent, tmp_path)
    progress.wait(is_event("start", world_size=2), START_TIMEOUT, "both nodes training")
    snapshot = progress.wait(is_event("snapshot", step=lambda s: s >= 2 * SNAPSHOT_EVERY), 60,
                             "a mid-epoch snapshot")
    host = progress.agent.pod_listening_on(port)
    assert host in ("mlp-node-0", "mlp-node-1"), f"no pod listens on the c10d port {port}"
    victim = other_node(host)  # the store host is scenario test_killing_the_store_host...
    killed = node_agent.kill(victim)
    killed_at = time.monotonic()

    resumed = progress.wait(is_event("start"), 60, "the survivor's workers restarting")
    first_step = progress.wait(is_event("step"), 60, "the first resumed step")
    seconds_to_resume = time.monotonic() - killed_at
    replacement = node_agent.wait_for_container(victim, 30, other_than=killed.uid)
    if resumed["world_size"] == 1:  # the survivor went on alone before the replacement was up
        progress.wait(is_event("start", world_size=2), 90, "the replacement joining the training")
    status = progress.wait_phase(C.PHASE_SUCCEEDED, 120)

    raw = assert_ran_exactly_once(progress.metrics_path, EPOCHS)
    restarts = assert_resumed_from_snapshots(raw)
    assert resumed["resume_step"] >= snapshot["step"] and first_step["step"] == resumed["resume_step"] + 1
    assert restarts, "no restart after the kill"
    # The killed node's only stand-in is its replacement: world size 2 at the end means it joined.
    assert world_size_phases(raw)[0] == 2 and world_size_phases(raw)[-1] == 2, world_size_phases(raw)
    assert status["restarts"] == 1 and replacement.exit_code == 0
    failed = [m for kind, reason, m in events(k8s) if (kind, reason) == (C.EVENT_WARNING, C.REASON_NODE_FAILED)]
    assert any(f"node pod {victim} failed (exit code 137, Error)" in m for m in failed), events(k8s)
    print(f"kill -> first resumed step: {seconds_to_resume:.1f} s")
