"""Operator replicas with kopf peering on the real control plane: the chart installed with
``replicaCount: 2, peering.enabled: true``, two operator pods of one Deployment; one acts, the
other stands by and takes over when the first stops. (The priority rules themselves, pure:
tests/operator/controller/test_peering_priority.py.)"""
import re

import pytest

from ddpjob_rdzv.process_start import stable_start_time
from ddpjob_sandbox.readers import pod_names
from tests.cluster.installed_operator import OPERATOR_READY_SECONDS, installed_operator, operator_selector, wait
from tests.cluster.operators import RELEASE_ENV, Operated, clean, status_manifest, unique_job_name, wait_handling_jobs

pytestmark = pytest.mark.cluster

PEERING = "ddpjob-operator"  # the chart's peering.name
RELEASE = "ddpjob-peering"


@pytest.fixture(scope="module")
def peered(control_plane, kubelets, status_nodes, tmp_path_factory):
    with installed_operator(control_plane, kubelets, tmp_path_factory, release=RELEASE, extra_env=RELEASE_ENV,
                            values={"replicaCount": 2, "peering.enabled": True}) as installed:
        wait_handling_jobs(installed)
        yield installed


def peers(kube) -> dict[str, dict]:
    return (kube.find("kopfpeerings", PEERING) or {}).get("status") or {}


def operator_pods(kube) -> list[dict]:
    return [p for p in kube.list("pods", label_selector=operator_selector(RELEASE)) if not p["metadata"].get("deletionTimestamp")]


def log_since(installed, pod: str, start: dict[str, int]) -> str:
    """What operator pod ``pod`` logged after ``start`` (each pod's log length then): kopf's
    object lines do not name the object."""
    return installed.pod_log(pod)[start[pod]:]


def own_view(installed, pod: str) -> str | None:
    """What operator pod ``pod`` last logged of its own view of the peering object: "acts",
    "stands by", or None (nothing yet: it starts standing by)."""
    said = re.findall(rf"Peering: this replica \({re.escape(pod)}\) (acts|stands by)", installed.pod_log(pod))
    return said[-1] if said else None


def running_pid(installed, pod: str) -> int:
    """The process id of operator pod ``pod``'s running container, from its kubelet."""
    found = [c.process.pid for c in installed.containers(pod) if c.process.poll() is None]
    assert len(found) == 1, f"{pod}: running containers {found}"
    return found[0]


def test_of_two_replicas_the_older_acts_and_the_other_takes_over_when_it_stops(peered):
    kube, job = peered.kube, unique_job_name()
    running = wait(peered, lambda: len(pods := [p for p in operator_pods(kube)
                                                if (p.get("status") or {}).get("phase") == "Running"]) == 2 and pods,
                   OPERATOR_READY_SECONDS, "two operator pods running")
    names = [p["metadata"]["name"] for p in running]
    wait(peered, lambda: set(names) <= set(peers(kube)), 30, "both replicas in the peering object")
    ranks = peers(kube)
    active, standby = sorted(names, key=lambda n: ranks[n]["priority"], reverse=True)
    assert ranks[active]["priority"] > ranks[standby]["priority"], ranks
    # The pods' startedAt has whole seconds: two replicas started a few milliseconds apart across a
    # second's boundary would look reversed. Their processes' own start (from /proc) is exact.
    started = {name: stable_start_time(running_pid(peered, name)) for name in names}
    assert started[active] <= started[standby], f"the younger replica ranks higher: {started}, {ranks}"
    # The operator's own view of the peering object (its cache's passes) agrees with kopf's. (Two
    # replicas started together may each act for a moment, kopf's handlers too, until the other's
    # first heartbeat shows.)
    wait(peered, lambda: own_view(peered, active) == "acts" and own_view(peered, standby) in (None, "stands by"),
         10, "the operator's own view of the peering object")
    start = {name: len(peered.pod_log(name)) for name in names}
    try:
        # Elastic bounds: the CRD refuses a change of replicas to a job started with fixed --nnodes.
        kube.create("ddpjobs", status_manifest(job, replicas=2, elasticPolicy={"minReplicas": 1, "maxReplicas": 3}))
        wait(peered, lambda: pod_names(kube, job) == [f"{job}-node-0", f"{job}-node-1"], 30, "two node pods")
        wait(peered, lambda: "Handler 'job_changed' succeeded" in log_since(peered, active, start),
             30, "the active replica's handler succeeding")
        # Same priorities would pause both and leave the job without pods; a standby that acted
        # too would race the active replica on every write.
        assert "Handler 'job_changed'" not in log_since(peered, standby, start), "the standby acted on the job too"
        assert "Pausing" not in log_since(peered, active, start) and "Resuming" not in log_since(peered, standby, start)

        logs = {active: peered.pod_log(active)}  # its kubelet forgets it once deleted
        # Its kubelet stops it (SIGTERM): a clean exit removes it from the peering object at once.
        kube.delete("pods", active)
        wait(peered, lambda: "Resuming operations after the pause" in log_since(peered, standby, start), 60,
             f"{standby} taking over")
        wait(peered, lambda: own_view(peered, standby) == "acts", 10, f"{standby}'s own passes taking over")
        kube.patch("ddpjobs", job, {"spec": {"replicas": 3}})
        wait(peered, lambda: f"{job}-node-2" in pod_names(kube, job), 30, f"{standby} scaling the job up")
        assert "Handler 'job_changed' succeeded" in log_since(peered, standby, start)
        logs[standby] = peered.pod_log(standby)
    finally:
        clean(Operated(peered, job))
    for name, log in logs.items():
        assert "Traceback" not in log, f"{name}:\n{log[-5000:]}"
