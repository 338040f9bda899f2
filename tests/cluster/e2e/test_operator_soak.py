"""Many jobs, a seeded random mix of node failures, scaling and suspensions, and an operator
restart in the middle: afterwards every job has exactly its desired pods, none failed, and
its status agrees with them.

The helm-installed operator on the real control plane, its pods on the status-only Nodes: the
test plays their kubelet (ddpjob_sandbox.scripted), starting each pod once the real scheduler
has bound it and failing the ones it picks. The restart is a SIGKILL of the operator's container
and the removal of its pod, after which its Deployment starts another, as in
test_operator_scaling.py.

A soak (`make soak`): the default suite keeps one scenario of each kind it mixes:
test_operator_scaling.py (scale, suspend and resume, an operator killed mid-pass) and
test_operator_policies.py / test_progress_operator.py (failures against the restart budget).
"""
import random
import time

import pytest

from ddpjob_operator.api import constants as C
from ddpjob_operator.render.common import job_selector, selector
from ddpjob_sandbox.client import ApiError, KubeClient
from ddpjob_sandbox.readers import pod_names, status
from ddpjob_sandbox.scripted import set_running, set_terminated
from tests.cluster.installed_operator import OPERATOR_READY_SECONDS, operator_selector
from tests.cluster.operators import Operated, kubelet_container, status_manifest

pytestmark = pytest.mark.cluster

JOBS, STEPS, SEED = 8, 40, 20261122
SETTLE_SECONDS = 60  # per job, with the operator running: a pass or two after the last event


def kubelet(report, kube: KubeClient, name: str, *args) -> bool:
    """Reports a pod state as its kubelet would; False when the operator deleted the pod meanwhile."""
    try:
        report(kube, name, *args)
    except ApiError as e:
        if e.status != 404:
            raise
        return False
    return True


def desired_names(job: str, replicas: int) -> list[str]:
    return [f"{job}-node-{i}" for i in range(replicas)]


def job_pods(kube: KubeClient, job: str) -> dict[str, dict]:
    """The job's live node pods by name (those marked for deletion are on their way out), as
    readers.pod_names lists them."""
    return {p["metadata"]["name"]: p for p in kube.list("pods", label_selector=selector(job))
            if not p["metadata"].get("deletionTimestamp")}


def phase(pod: dict) -> str | None:
    return (pod.get("status") or {}).get("phase")


def start_bound_pods(kube: KubeClient, job: str) -> None:
    """The kubelet's part: every pod of the job that the scheduler bound and that has not started
    yet starts. An unbound one waits for the scheduler; a Failed one for the operator to replace it
    (the API server refuses a terminal pod's return to Running)."""
    for name, pod in job_pods(kube, job).items():
        if pod["spec"].get("nodeName") and phase(pod) in (None, "Pending"):
            kubelet(set_running, kube, name)


def settled(kube: KubeClient, job: str, replicas: int, suspended: bool) -> bool:
    if suspended:
        return pod_names(kube, job) == [] and status(kube, job).get("phase") == C.PHASE_SUSPENDED
    pods = job_pods(kube, job)
    if sorted(pods) != desired_names(job, replicas):
        return False
    if any(phase(pod) != "Running" for pod in pods.values()):
        start_bound_pods(kube, job)
        return False
    current = status(kube, job)
    return (current.get("phase") == C.PHASE_RUNNING and current.get("replicas") == replicas
            and kube.find("services", job) is not None)


def wait_settled(kube: KubeClient, jobs: dict, what: str, timeout: float = SETTLE_SECONDS) -> None:
    for job, want in jobs.items():
        kube.wait_for(lambda: settled(kube, job, want["replicas"], want["suspended"]), timeout=timeout,
                      interval=0.2, what=f"{job} to {what} at {want}")


def caught_up(kube: KubeClient, job: str) -> bool:
    """A pass wrote the job's latest generation: its pods are ones the operator wants now, not
    ones a suspension or scale-down it already decided is about to delete. A failure of such a
    pod the operator rightly never sees; one of a pod it wants it must count, however soon a
    later suspension or scale-down follows (decide/status.py)."""
    body = kube.get("ddpjobs", job)
    return (body.get("status") or {}).get("observedGeneration") == body["metadata"]["generation"]


def kill_operator(operator: Operated) -> str:
    """SIGKILLs the operator's container and removes its pod (its Deployment starts another);
    returns the killed pod's uid."""
    kube = operator.kube
    (pod,) = [p for p in kube.list("pods", label_selector=operator_selector(operator.installed.release))
              if not p["metadata"].get("deletionTimestamp")]
    kubelet_container(operator, pod).kill()  # no chance to finish a pass or clean up
    kube.delete("pods", pod["metadata"]["name"], gracePeriodSeconds=0)
    return pod["metadata"]["uid"]


def wait_operator_back(operator: Operated, killed: str) -> None:
    kube = operator.kube
    kube.wait_for(lambda: any(p["metadata"]["uid"] != killed and phase(p) == "Running"
                              for p in kube.list("pods", label_selector=operator_selector(operator.installed.release))),
                  timeout=OPERATOR_READY_SECONDS, interval=0.5, what="the Deployment's new operator pod running")


@pytest.mark.slow  # 8 jobs, 40 random events and an operator restart
@pytest.mark.timeout(3 * OPERATOR_READY_SECONDS + 2 * SETTLE_SECONDS)
def test_random_failures_scaling_suspensions_and_an_operator_restart_converge(operator):
    kube = operator.kube
    rng = random.Random(SEED)
    jobs = {operator.name(f"s{i}"): {"replicas": rng.randint(1, 4), "suspended": False} for i in range(JOBS)}
    policy = {"maxRestarts": 1000, "backoffSeconds": 0}
    failed_jobs, killed = set(), None
    for job, want in jobs.items():
        kube.create("ddpjobs", status_manifest(job, replicas=want["replicas"], failurePolicy=policy,
                                               elasticPolicy={"minReplicas": 1, "maxReplicas": 4}))
    # Every job runs before the first event: on a loaded machine the operator took longer to
    # start the pods than the events, which then found no pod to fail and tested nothing.
    wait_settled(kube, jobs, "start")
    for step in range(STEPS):
        if step == STEPS // 2:  # the operator dies without warning and comes back
            killed = kill_operator(operator)
        job = rng.choice(sorted(jobs))
        want, action = jobs[job], rng.choice(["fail", "fail", "scale", "suspend"])
        # Only wanted, running nodes of running jobs fail: a pod that suspension or scale-down is
        # removing anyway does not count as a failure incident.
        wanted = set(desired_names(job, want["replicas"]))
        running = not want["suspended"] and caught_up(kube, job)
        names = sorted(n for n, p in job_pods(kube, job).items() if n in wanted and phase(p) == "Running") \
            if running else []
        if action == "fail" and names:
            if kubelet(set_terminated, kube, rng.choice(names), rng.choice([1, 137])):
                failed_jobs.add(job)
        elif action == "scale":
            want["replicas"] = rng.randint(1, 4)
            kube.patch("ddpjobs", job, {"spec": {"replicas": want["replicas"]}})
        elif action == "suspend":
            want["suspended"] = not want["suspended"]
            kube.patch("ddpjobs", job, {"spec": {"runPolicy": {"suspend": want["suspended"]}}})
        start_bound_pods(kube, job)
        time.sleep(0.1)  # let the operator act on some events before the next one
    wait_operator_back(operator, killed)
    # Its pod running is not yet its watches listing: the first job also waits out kopf's start.
    wait_settled(kube, jobs, "settle", timeout=OPERATOR_READY_SECONDS)
    for job in jobs:  # one headless Service each; the store is in node 0 (status_manifest)
        assert [s["metadata"]["name"] for s in kube.list("services", label_selector=job_selector(job))] == [job]
    # Failures close together are one incident, so each failed job counted at least one.
    counted = {job for job in jobs if status(kube, job).get("restarts")}
    assert failed_jobs and counted == failed_jobs, (failed_jobs, counted)
