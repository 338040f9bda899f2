"""End to end on the real control plane: ``kubectl apply`` of the c10d example, the
helm-installed operator, real torchrun and real training of the example MLP on the kubelets'
Nodes (the real scheduler places each pod); then faults.

Test-speed overrides (see ``ddpjob_sandbox.examples.example_job``): a copy of
manifests/examples/ddpjob-c10d.yaml is applied with fewer samples, ``--step-sleep`` and
``--snapshot-every-steps`` in the trainer args, one worker per node, a free rendezvous port,
short rdzvTimeouts (3 s last call, 2 s x 3 keep-alive) and a 1 s crash-loop backoff, under a
job name and on a snapshot claim of the test's own (tests/cluster/sandbox/scenarios.py).
Everything else (replicas 2, minReplicas 1, maxReplicas 4, the failure policy's budget and
permanent codes) is the example's.
"""
from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ddpjob_operator.api import constants as C
from tests.cluster.sandbox.scenarios import TEST_SECONDS, Sandbox
from tests.support.elastic_checks import assert_ran_exactly_once, assert_resumed_from_snapshots, world_size_phases
from ddpjob_sandbox.readers import condition, events
from ddpjob_sandbox.metrics import JobProgress, is_event
from ddpjob_sandbox.examples import trainer_args

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(TEST_SECONDS)]

EPOCHS = 4
SNAPSHOT_EVERY = 10
START_TIMEOUT = 120  # operator + 2 torchrun agents + 2 workers importing torch on 2 shared cores
REPLACEMENT_TIMEOUT = 180  # a replacement pod starting and importing torch (70 s seen at load 28 on 2 cores)


def start_example(sandbox: Sandbox, *, epochs: int = EPOCHS, samples: int = 2048,
                  step_sleep: float = 0.1, extra: tuple[str, ...] = (),
                  edit: Callable[[dict], None] | None = None) -> tuple[JobProgress, int]:
    """Applies the test-speed copy of the example (``edit`` changes its spec further)."""
    args = trainer_args(epochs=epochs, samples=samples, step_sleep=step_sleep,
                        snapshot_every_steps=SNAPSHOT_EVERY, extra=extra)
    progress, body = sandbox.start_job(args=args, rdzv_store=None, edit=edit)
    return progress, body["spec"]["elasticPolicy"]["rdzvPort"]


def zygote_servers() -> set[str]:
    """The sockets of the worker fork servers (ddpjob_trainer.zygote --serve) running on this machine."""
    found = set()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            argv = cmdline.read_bytes().decode(errors="replace").split("\0")
            if "ddpjob_trainer.zygote" in argv and "--serve" in argv:
                found.add(argv[argv.index("--serve") + 1])
    return found


def local_env(sandbox: Sandbox, name: str) -> dict[str, str]:
    """The environment pod ``name``'s main process runs with on its Node (paths under its
    mounts made local by its kubelet)."""
    container = sandbox.nodes.current(name)
    pairs = Path(f"/proc/{container.process.pid}/environ").read_bytes().decode(errors="replace").split("\0")
    return dict(pair.split("=", 1) for pair in pairs if "=" in pair)


def pod_env(k8s, name: str) -> dict[str, str]:
    (container,) = k8s.get("pods", name)["spec"]["containers"]
    return {e["name"]: e.get("value") for e in container["env"]}


# The example turns fastRestart on (its image has ddpjob-trainer); off is torch's own path.
@pytest.mark.parametrize("fast_restart", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_a_killed_node_is_replaced_and_training_resumes_from_the_snapshot_to_success(sandbox: Sandbox, fast_restart):
    k8s, nodes, job = sandbox.kube, sandbox.nodes, sandbox.job

    def policy(spec: dict) -> None:
        # minReplicas 2: the survivor waits for the replacement (up to joinSeconds) instead of going
        # on alone, which let it finish first whenever the replacement's torch import was slow (a
        # loaded machine), so no one joined.
        spec["elasticPolicy"].update(fastRestart=fast_restart, minReplicas=2)
        spec["elasticPolicy"]["rdzvTimeouts"]["joinSeconds"] = REPLACEMENT_TIMEOUT

    progress, port = start_example(sandbox, edit=policy)
    progress.wait(is_event("start", world_size=2), START_TIMEOUT, "both nodes training")
    env = pod_env(k8s, f"{job}-node-0")
    assert env["PET_RDZV_BACKEND"] == ("ddpjob-c10d" if fast_restart else "c10d")
    # The survivor's workers are forked by its node's server (none without fastRestart), whose
    # socket lies in the pod's emptyDir: the sandbox node maps it to a directory of the pod's.
    assert (local_env(sandbox, f"{job}-node-0").get("DDPJOB_ZYGOTE_SOCKET") in zygote_servers()) is fast_restart
    snapshot = progress.wait(is_event("snapshot", step=lambda s: s >= 2 * SNAPSHOT_EVERY), 60,
                             "a mid-epoch snapshot")
    # As in a cluster, the store pod (the c10d default, the pod the endpoint names) hosts the store.
    assert nodes.pod_listening_on(port) == f"{job}-rdzv", f"the store pod does not listen on the c10d port {port}"
    victim = f"{job}-node-1"
    killed = nodes.kill(victim)
    killed_at = time.monotonic()

    replacement = nodes.wait_for_container(victim, START_TIMEOUT, other_than=killed.uid)
    resumed = progress.wait(is_event("start"), REPLACEMENT_TIMEOUT, "the survivor and the replacement training")
    first_step = progress.wait(is_event("step"), 60, "the first resumed step")
    seconds_to_resume = time.monotonic() - killed_at
    status = progress.wait_phase(C.PHASE_SUCCEEDED, 120)

    raw = assert_ran_exactly_once(progress.metrics_path, EPOCHS)
    restarts = assert_resumed_from_snapshots(raw)
    assert resumed["resume_step"] >= snapshot["step"] and first_step["step"] == resumed["resume_step"] + 1
    assert restarts, "no restart after the kill"
    # The killed node's only stand-in is its replacement: world size 2 throughout means it joined.
    assert resumed["world_size"] == 2 and set(world_size_phases(raw)) == {2}, world_size_phases(raw)
    assert status["restarts"] == 1 and replacement.exit_code == 0
    failed = [m for kind, reason, m in events(k8s, job) if (kind, reason) == (C.EVENT_WARNING, C.REASON_NODE_FAILED)]
    assert any(f"node pod {victim} failed (exit code 137, Error)" in m for m in failed), events(k8s, job)
    print(f"kill -> first resumed step: {seconds_to_resume:.1f} s")


def test_a_permanent_exit_code_fails_the_job_with_the_reason_in_status_and_an_event(sandbox: Sandbox):
    """torchrun exits 1 whatever its workers' exit codes are (ChildFailedError), so the only code a
    trainer error can give a node pod is 1: this job lists 1 as permanent (on top of the
    example's 126, 127), lets torchrun restart nobody (elasticPolicy.maxRestarts 0) and makes
    the trainer raise at step 5 (--fail-at-step, a debugging flag of the example)."""
    k8s, nodes, job = sandbox.kube, sandbox.nodes, sandbox.job

    def fail_fast(spec: dict) -> None:
        spec["elasticPolicy"]["maxRestarts"] = 0
        spec["failurePolicy"]["permanentExitCodes"] = [1, 126, 127]

    progress, _ = start_example(sandbox, extra=("--fail-at-step", "5"), edit=fail_fast)
    progress.wait(is_event("step", step=5), START_TIMEOUT, "training up to the failing step")
    status = progress.wait_phase(C.PHASE_FAILED, 60)

    failed = condition(k8s, C.COND_FAILED, job)
    assert failed["status"] == "True" and failed["reason"] == C.REASON_PERMANENT_ERROR
    assert "failed (exit code 1, Error)" in failed["message"] and "permanentExitCodes" in failed["message"]
    expected = (C.EVENT_WARNING, C.REASON_PERMANENT_ERROR, failed["message"])
    # The operator posts a pass's Events after its status write: this test may be a moment ahead.
    k8s.wait_for(lambda: expected in events(k8s, job), timeout=30, interval=0.2, what="the PermanentExitCode Event")
    assert status["restarts"] == 0
    # Nothing was replaced and nothing is left running (cleanPodPolicy Running deletes a survivor).
    k8s.wait_for(lambda: all(c.exit_code is not None for c in nodes.all()), timeout=20,
                 what="every node process gone")
    assert sorted(c.name for c in nodes.all()) == [f"{job}-node-0", f"{job}-node-1", f"{job}-rdzv"]
    assert not any(e["event"] == "done" for e in progress.events())


@pytest.mark.slow  # ~75 s: the survivor loses the store too, so the whole group restarts
def test_killing_the_node_that_hosts_the_c10d_store_still_recovers_to_success(sandbox: Sandbox):
    """Node 0 hosts the store (the sandbox node keeps torch's cluster behaviour: only the pod the
    endpoint names hosts); its death takes the rendezvous with it, so every node restarts."""
    k8s, nodes, job = sandbox.kube, sandbox.nodes, sandbox.job
    progress, port = start_example(sandbox, edit=lambda spec: spec["elasticPolicy"].update(rdzvStore="node"))
    progress.wait(is_event("start", world_size=2), START_TIMEOUT, "both nodes training")
    snapshot = progress.wait(is_event("snapshot", step=lambda s: s >= 2 * SNAPSHOT_EVERY), 60,
                             "a mid-epoch snapshot")
    host = nodes.pod_listening_on(port)
    assert host == f"{job}-node-0", f"the c10d port {port} is held by {host}, not node 0"
    killed = nodes.kill(host)

    resumed = progress.wait(is_event("start"), 120, "training restarting without the store's host")
    progress.wait(is_event("step"), 60, "the first resumed step")
    nodes.wait_for_container(host, 30, other_than=killed.uid)
    status = progress.wait_phase(C.PHASE_SUCCEEDED, 120)

    raw = assert_ran_exactly_once(progress.metrics_path, EPOCHS)
    assert assert_resumed_from_snapshots(raw), "no restart after the kill"
    assert resumed["resume_step"] >= snapshot["step"]
    # The operator saw the store host die and restarted the whole group as one incident.
    assert status["restarts"] == 1 and status["rendezvousGeneration"] == 1, status
    group = [m for kind, reason, m in events(k8s, job) if (kind, reason) == (C.EVENT_WARNING, C.REASON_GROUP_RESTART)]
    assert any(f"{job}-node-0" in m and "exit code 137" in m for m in group), events(k8s, job)


@pytest.mark.slow  # ~90 s: three nodes on two shared cores
def test_scaling_up_and_down_mid_run_changes_the_world_size_and_the_job_succeeds(sandbox: Sandbox):
    k8s, nodes, job = sandbox.kube, sandbox.nodes, sandbox.job
    epochs = 6
    progress, _ = start_example(sandbox, epochs=epochs)
    progress.wait(is_event("start", world_size=2), START_TIMEOUT, "both nodes training")
    progress.wait(is_event("snapshot", step=lambda s: s >= SNAPSHOT_EVERY), 60, "a first snapshot")

    k8s.kubectl("scale", f"ddpjob/{job}", "--replicas=3")
    progress.wait(is_event("start", world_size=3), 120, "the third node joining")
    progress.wait(is_event("step", world_size=3), 60, "a step with three nodes")
    third = nodes.current(f"{job}-node-2")
    k8s.kubectl("scale", f"ddpjob/{job}", "--replicas=2")
    progress.wait(is_event("start", world_size=2), 120, "training going on with two nodes")
    k8s.wait_for(lambda: k8s.find("pods", f"{job}-node-2") is None, timeout=30, what=f"{job}-node-2 deleted")
    status = progress.wait_phase(C.PHASE_SUCCEEDED, 180)

    raw = assert_ran_exactly_once(progress.metrics_path, epochs)
    assert_resumed_from_snapshots(raw)
    assert world_size_phases(raw) == [2, 3, 2], world_size_phases(raw)
    assert third.exit_code is not None and status["restarts"] == 0, "a scale-down is no failure"
    assert not [e for e in events(k8s, job) if e[1] == C.REASON_NODE_FAILED], events(k8s, job)
