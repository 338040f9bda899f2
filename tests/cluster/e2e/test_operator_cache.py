"""The helm-installed operator reads from its watch-fed cache (controller/cache.py): once it has
listed, its passes make no LIST and no GET, however many there are, and what happens behind its
back (a pod deleted by someone else) reaches it by the watch. Its requests are counted from the
real API server's audit log, by the operator's ServiceAccount (both its clients)."""
import pytest

from ddpjob_operator.api import constants as C
from ddpjob_sandbox.readers import pod_names, status
from ddpjob_sandbox.scripted import set_running
from tests.cluster.installed_operator import audit_events, audit_offset, requests_by
from tests.cluster.operators import status_manifest

pytestmark = pytest.mark.cluster


def reads(control_plane, account: str, since: int) -> list[str]:
    """The operator's GETs and LISTs, as request URIs (what a failure shows)."""
    return [e["requestURI"] for e in audit_events(control_plane, since)
            if e["user"]["username"] == account and e["verb"] in ("get", "list")]


def test_steady_state_passes_make_no_list_and_no_get(operator, control_plane):
    kube, job = operator.kube, operator.job
    kube.create("ddpjobs", status_manifest(job, replicas=2))
    nodes = [f"{job}-node-0", f"{job}-node-1"]
    kube.wait_for(lambda: pod_names(kube, job) == nodes and status(kube, job).get("replicas") == 2,
                  timeout=20, what="two node pods in the status")
    since = audit_offset(control_plane)
    for name in nodes:  # each pod event is a pass; the last one finds the job running
        set_running(kube, name)
    kube.wait_for(lambda: status(kube, job).get("phase") == C.PHASE_RUNNING, timeout=20, what="the job running")
    made = requests_by(control_plane, operator.account, since)
    assert (made["list"], made["get"]) == (0, 0), (made, reads(control_plane, operator.account, since))
    assert made["patch"] > 0, f"the passes ran: they wrote the new phase ({made})"


def test_a_pod_deleted_behind_the_operators_back_is_replaced_from_the_watch(operator, control_plane):
    kube, job = operator.kube, operator.job
    kube.create("ddpjobs", status_manifest(job, replicas=2))
    victim = f"{job}-node-1"
    kube.wait_for(lambda: pod_names(kube, job) == [f"{job}-node-0", victim], timeout=20, what="two node pods")
    old = kube.get("pods", victim)["metadata"]["uid"]
    since = audit_offset(control_plane)
    kube.delete("pods", victim)
    kube.wait_for(lambda: (p := kube.find("pods", victim)) and p["metadata"]["uid"] != old,
                  timeout=20, what="the replacement pod")
    # The one read a real cluster adds: the deleted pod stays until its Node removes it, and once
    # past its deletionTimestamp the operator reads that Node (the stuck-terminating check,
    # decide/stuck.py; the emulator deleted at once). Nothing of the job is read.
    job_reads = [uri for uri in reads(control_plane, operator.account, since) if not uri.startswith("/api/v1/nodes/")]
    assert job_reads == []
    made = requests_by(control_plane, operator.account, since)
    assert made["list"] == 0, made
    assert made["create"] > 0, f"the replacement was created ({made})"
