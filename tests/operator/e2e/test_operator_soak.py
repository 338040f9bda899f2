"""Many jobs, a seeded random mix of node failures, scaling and suspensions, and an operator
restart in the middle: afterwards every job has exactly its desired pods, none failed, and
its status agrees with them. Real operator against the API emulator.

A soak (`make soak`): the default suite keeps one scenario of each kind it mixes, in
tests/cluster/e2e/: test_operator_scaling.py (scale, suspend and resume, an operator killed
mid-pass) and test_operator_policies.py / test_progress_operator.py (failures against the restart budget).
"""
import random
import time

import pytest

from ddpjob_operator.api import constants as C
from ddpjob_sandbox.jobs import make_manifest
from ddpjob_sandbox.readers import pod_names, status
from ddpjob_sandbox.scripted import set_running, set_terminated
from ddpjob_sandbox.client import ApiError
from ddpjob_sandbox.operator_process import OperatorProcess, operator_command

JOBS, STEPS, SEED = 8, 40, 20261122


def kubelet(report, k8s, name, *args):
    """Reports a pod state like a kubelet; the pod may be deleted by the operator meanwhile."""
    try:
        report(k8s, name, *args)
    except ApiError as e:
        if e.status != 404:
            raise
        return False
    return True


def desired_names(job: str, replicas: int) -> list[str]:
    return [f"{job}-node-{i}" for i in range(replicas)]


def settled(k8s, job: str, replicas: int, suspended: bool) -> bool:
    names = pod_names(k8s, job)
    if suspended:
        return names == [] and status(k8s, job).get("phase") == C.PHASE_SUSPENDED
    if names != desired_names(job, replicas):
        return False
    pods = {p["metadata"]["name"]: p for p in k8s.list("pods", label_selector=f"{C.LABEL_JOB_NAME}={job}")}
    for name in names:
        if (pods[name].get("status") or {}).get("phase") != "Running":
            kubelet(set_running, k8s, name)  # the kubelet starts every (re)created pod
            return False
    current = status(k8s, job)
    return (current.get("phase") == C.PHASE_RUNNING and current.get("replicas") == replicas
            and k8s.find("services", job) is not None)


def wait_settled(k8s, jobs: dict, what: str) -> None:
    for job, want in jobs.items():
        k8s.wait_for(lambda: settled(k8s, job, want["replicas"], want["suspended"]), timeout=60, interval=0.2,
                     what=f"{job} to {what} at {want}")


def caught_up(k8s, job: str) -> bool:
    """A pass wrote the job's latest generation: its pods are ones the operator wants now, not
    ones a suspension or scale-down it already decided is about to delete. A failure of such a
    pod the operator rightly never sees; one of a pod it wants it must count, however soon a
    later suspension or scale-down follows (decide/status.py)."""
    body = k8s.get("ddpjobs", job)
    return (body.get("status") or {}).get("observedGeneration") == body["metadata"]["generation"]


@pytest.mark.slow  # 8 jobs, 40 random events and an operator restart
def test_random_failures_scaling_suspensions_and_an_operator_restart_converge(cluster, k8s, tmp_path):
    rng = random.Random(SEED)
    jobs = {f"job{i}": {"replicas": rng.randint(1, 4), "suspended": False} for i in range(JOBS)}
    policy = {"maxRestarts": 1000, "backoffSeconds": 0}
    failed_jobs = set()
    operator = OperatorProcess(cluster, operator_command(k8s.namespace), tmp_path / "first.log").start()
    try:
        for job, want in jobs.items():
            k8s.create("ddpjobs", make_manifest(job, replicas=want["replicas"], failurePolicy=policy,
                                                elasticPolicy={"minReplicas": 1, "maxReplicas": 4}))
        # Every job runs before the first event: on a loaded machine the operator took longer to
        # start than the events, which then found no pod to fail and tested nothing.
        wait_settled(k8s, jobs, "start")
        for step in range(STEPS):
            if step == STEPS // 2:  # the operator dies without warning and comes back
                operator.kill()
                operator = OperatorProcess(cluster, operator_command(k8s.namespace), tmp_path / "second.log").start()
            job = rng.choice(sorted(jobs))
            want, action = jobs[job], rng.choice(["fail", "fail", "scale", "suspend"])
            # Only wanted nodes of running jobs fail: a pod that suspension or scale-down is
            # removing anyway does not count as a failure incident.
            wanted = set(desired_names(job, want["replicas"]))
            running = not want["suspended"] and caught_up(k8s, job)
            names = sorted(set(pod_names(k8s, job)) & wanted) if running else []
            if action == "fail" and names:
                if kubelet(set_terminated, k8s, rng.choice(names), rng.choice([1, 137])):
                    failed_jobs.add(job)
            elif action == "scale":
                want["replicas"] = rng.randint(1, 4)
                k8s.patch("ddpjobs", job, {"spec": {"replicas": want["replicas"]}})
            elif action == "suspend":
                want["suspended"] = not want["suspended"]
                k8s.patch("ddpjobs", job, {"spec": {"runPolicy": {"suspend": want["suspended"]}}})
            for name in pod_names(k8s, job):  # the kubelet starts what the operator created
                if not (k8s.find("pods", name) or {"status": "gone"}).get("status"):
                    kubelet(set_running, k8s, name)
            time.sleep(0.1)  # let the operator act on some events before the next one
        wait_settled(k8s, jobs, "settle")
        assert len(k8s.list("services")) <= 2 * JOBS  # per job: the headless one and the store pod's
        # Failures close together are one incident, so each failed job counted at least one.
        counted = {job for job in jobs if status(k8s, job).get("restarts")}
        assert failed_jobs and counted == failed_jobs, (failed_jobs, counted)
    finally:
        operator.stop()
    for log in (tmp_path / "first.log", tmp_path / "second.log"):
        assert "Traceback" not in log.read_text(), log.read_text()[-4000:]
