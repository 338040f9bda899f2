"""The helm-installed operator against a real API server that is slow, cuts its connections and
compacts the history its watches resume from: jobs still finish, the operator never restarts,
and its requests (counted from the API server's audit log) stay bounded.

The operator's pod reaches the API server through control_plane.proxy.FaultProxy: its kubelets
hand the pod a kubeconfig naming the proxy (make_kubelet's pod_api_url), so the operator runs
as in the rest of the tier (its Deployment's pod, the chart's ServiceAccount, TLS verified end
to end) and only its own traffic meets the faults; the kubelets, helm and the test go direct.

This module runs a control plane of its own: its API server serves watches from etcd
(``--watch-cache=false``). With the watch cache on, a watch resumes from the cache's memory of
recent events, which etcd compaction does not touch, so compaction reaches a client only once
its resourceVersion left the cache; served from etcd, a resumed watch from before the compacted
revision ends with 410 Gone at once, which is what the compaction test needs.
"""
from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from ddpjob_operator.api import constants as C
from ddpjob_operator.controller.cache import WATCHED
from ddpjob_sandbox.control_plane import ControlPlane, audit, running_control_plane
from ddpjob_sandbox.control_plane.kubelets import running_kubelets
from ddpjob_sandbox.control_plane.proxy import FaultProxy
from ddpjob_sandbox.control_plane.runner import compact_etcd
from tests.cluster.conftest import HEARTBEAT_SECONDS, NODE_MONITOR_GRACE_SECONDS
from tests.cluster.sandbox_only import OWN_CONTROL_PLANE
from tests.cluster.installed_operator import (
    JOB_SECONDS, OPERATOR_READY_SECONDS, OPERATOR_SELECTOR, RELEASE, Installed, installed_operator, pods_created_by,
    start_example, wait, wait_finished,
)

NODES = ("faulty-0", "faulty-1")
LATENCY_SECONDS = 0.2  # each way, each chunk: a far region's round trip, twice over
CUT_EVERY_SECONDS = 4.0  # how often every connection of the operator is cut while a job runs
SETTLE_SECONDS = 30.0  # the operator re-listing and re-watching after the last fault
CONTROL_PLANE_SECONDS = 180  # this module's own control plane starts in the first test's setup
# slow (make soak): a control plane of its own with the watch cache off, a helm install and two jobs
# trained under faults, minutes on two cores; the default suite keeps its 20-minute budget.
pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.sandbox_only(OWN_CONTROL_PLANE),
              pytest.mark.timeout(CONTROL_PLANE_SECONDS + OPERATOR_READY_SECONDS + JOB_SECONDS + 4 * SETTLE_SECONDS)]


@dataclass(frozen=True)
class Faulty:
    control_plane: ControlPlane
    proxy: FaultProxy
    installed: Installed

    @property
    def log(self):
        return self.control_plane.layout.audit_log

    def operator_requests(self, start: int) -> list[audit.Request]:
        return [r for r in audit.requests(self.log, start) if r.user == self.installed.account]


@pytest.fixture(scope="module")
def faulty(tmp_path_factory) -> Iterator[Faulty]:
    root = tmp_path_factory.mktemp("faulty")
    with running_control_plane(root / "control-plane", node_monitor_grace_seconds=NODE_MONITOR_GRACE_SECONDS,
                               apiserver_flags=("--watch-cache=false",)) as control_plane, \
            FaultProxy(("127.0.0.1", control_plane.layout.ports.apiserver)) as proxy, \
            running_kubelets(control_plane.layout.pki, control_plane.url, root / "kubelets", NODES,
                             heartbeat_seconds=HEARTBEAT_SECONDS, poll_seconds=0.2,
                             pod_api_url=proxy.url) as kubelets, \
            installed_operator(control_plane, kubelets, tmp_path_factory) as installed:
        yield Faulty(control_plane, proxy, installed)


def whole_list(request: audit.Request) -> bool:
    """A list of a whole kind (what a start or a broken watch costs), not the look-up by name the
    operator makes after a create answered 409 (its cache had not seen the object yet)."""
    return request.verb == "list" and "fieldSelector=metadata.name" not in request.uri


def watching_everything(faulty: Faulty) -> bool:
    """Whether the operator's last list-or-watch of each kind it follows is a watch: its cache's
    of each kind and kopf's of the DDPJobs (after a start or a fault, each lists, then watches)."""
    last: dict[tuple[bool, str], str] = {}
    for r in faulty.operator_requests(0):
        if r.verb == "watch" or whole_list(r):
            last[(r.user_agent.startswith("kopf/"), r.resource)] = r.verb
    expected = {(False, kind.plural) for kind in WATCHED} | {(True, C.PLURAL)}
    return all(last.get(key) == "watch" for key in expected)


@pytest.fixture
def clean(faulty: Faulty) -> Iterator[Faulty]:
    """The operator watching every kind it follows (its start-up lists, or the last test's
    faults, behind it), and no fault left on for the next test."""
    wait(faulty.installed, lambda: watching_everything(faulty), SETTLE_SECONDS * 2,
         "the operator watching every kind it follows")
    assert faulty.proxy.open_connections() >= 1, "the operator's watches pass through the proxy (nothing else does)"
    yield faulty
    faulty.proxy.latency = 0.0
    faulty.proxy.lose_responses(0)


def operator_container(faulty: Faulty):
    """The operator's running container on its kubelet (the one pod of the release)."""
    (container,) = [c for k in faulty.installed.kubelets for c in list(k.agent.pods.values())
                    if c.name.startswith(f"{RELEASE}-ddpjob-operator-")]
    return container


def assert_never_restarted(faulty: Faulty, container) -> None:
    assert container.exit_code is None, f"the operator exited with {container.exit_code}:\n{container.log(3000)}"
    assert operator_container(faulty) is container, "no second operator container"
    (pod,) = faulty.installed.kube.list("pods", label_selector=OPERATOR_SELECTOR)
    assert pod["status"]["containerStatuses"][0]["restartCount"] == 0
    assert "Traceback" not in container.log(200_000), container.log(3000)


def per_kind(requests: list[audit.Request]) -> dict:
    return dict(audit.count(requests, by=("verb", "resource")))


def test_with_latency_a_job_succeeds_without_restarting_the_operator_or_extra_requests(clean: Faulty):
    faulty = clean
    container = operator_container(faulty)
    faulty.proxy.latency = LATENCY_SECONDS
    start = audit.mark(faulty.log)
    start_example(faulty.installed, "slow")
    assert wait_finished(faulty.installed, "slow")["phase"] == C.PHASE_SUCCEEDED
    faulty.proxy.latency = 0.0
    time.sleep(SETTLE_SECONDS)  # what a slow answer may have left to repeat shows now
    assert_never_restarted(faulty, container)
    requests = faulty.operator_requests(start)
    counts = per_kind(requests)
    # Latency alone breaks nothing: the watches stay open, so no kind is listed again...
    assert not [r for r in requests if whole_list(r)], counts
    # ...and each of the job's pods is created once. A pass may plan a pod its cache has not seen
    # yet (the watch event is late): that create answers 409 and costs one look-up by name.
    created = [r.name for r in requests if (r.verb, r.resource, r.code) == ("create", "pods", 201)]
    assert sorted(created) == sorted(set(created)) and created, created
    again = [r for r in requests if (r.verb, r.resource, r.code) == ("create", "pods", 409)]
    assert len(again) <= len(created), f"{len(again)} creates answered 409 for {len(created)} pods: {counts}"
    # ...and the job costs what it costs without latency: its objects, a few status writes, Events.
    assert len(requests) <= 50, f"{len(requests)} requests for one 2-node job: {counts}"


def cut_while(faulty: Faulty, stop: threading.Event, faults: list[str]) -> None:
    """Every CUT_EVERY_SECONDS: every connection cut, and every other time the next answer lost."""
    for i in range(1_000):
        if stop.wait(CUT_EVERY_SECONDS):
            return
        if i % 2:
            faulty.proxy.lose_responses(1)
            faults.append("lost answer")
        else:
            faulty.proxy.drop()
            faults.append("cut")


def test_with_watches_and_requests_cut_a_job_succeeds_and_the_operator_relists_boundedly(clean: Faulty):
    faulty = clean
    container = operator_container(faulty)
    before = (faulty.proxy.stats.cut, faulty.proxy.stats.lost_responses)
    start = audit.mark(faulty.log)
    stop = threading.Event()
    injected: list[str] = []
    cutter = threading.Thread(target=cut_while, args=(faulty, stop, injected), daemon=True)
    cutter.start()
    try:
        start_example(faulty.installed, "cut")
        assert wait_finished(faulty.installed, "cut")["phase"] == C.PHASE_SUCCEEDED
    finally:
        stop.set()
        cutter.join()
    faulty.proxy.lose_responses(0)
    cuts = faulty.proxy.stats.cut - before[0]
    lost = faulty.proxy.stats.lost_responses - before[1]
    assert cuts >= 3 and lost >= 1, f"the faults happened: {cuts} connections cut, {lost} answers lost"
    time.sleep(SETTLE_SECONDS)
    assert_never_restarted(faulty, container)
    assert pods_created_by(faulty.control_plane, faulty.installed.kube.namespace, "cut-") == {
        faulty.installed.account}
    requests = faulty.operator_requests(start)
    counts = per_kind(requests)
    faults = len(injected)
    # Each fault costs at most a list and a watch of each kind the operator follows (its cache's 5,
    # kopf's DDPJobs) and a retry of the request it cut: a flood would be many per fault.
    relists = len([r for r in requests if whole_list(r)])
    assert relists <= 6 * faults, f"{relists} lists for {faults} faults: {counts}"
    assert len(requests) <= 60 + 14 * faults, f"{len(requests)} requests for {faults} faults: {counts}"


def kopf_requests(faulty: Faulty, start: int) -> list[audit.Request]:
    return [r for r in faulty.operator_requests(start) if r.user_agent.startswith("kopf/")]


def watches_of(requests: list[audit.Request], resource: str) -> list[int]:
    """The resourceVersions the watches of ``resource`` resumed from (0: from a list's snapshot)."""
    versions = []
    for r in requests:
        if (r.verb, r.resource) == ("watch", resource):
            found = re.search(r"[?&]resourceVersion=(\d+)", r.uri)
            versions.append(int(found.group(1)) if found else 0)
    return versions


def test_a_watch_from_a_compacted_revision_is_gone_and_the_operator_lists_again_and_goes_on(clean: Faulty):
    faulty = clean
    kube = faulty.installed.kube
    container = operator_container(faulty)
    start = audit.mark(faulty.log)
    # The API server out of reach: open connections cut, new ones refused, while the history the
    # operator's watches would resume from is compacted away.
    with faulty.proxy.refusing():
        faulty.proxy.drop()
        kube.create("configmaps", {"metadata": {"name": "after-the-last-job-event"}})
        compacted = compact_etcd(faulty.control_plane.layout)
        refused_at = faulty.proxy.stats.refused
        time.sleep(5)
    # kopf's own watch of the DDPJobs (the operator's cache re-lists after any broken watch).
    requests = kube.wait_for(
        lambda: (found := kopf_requests(faulty, start)) and [v for v in watches_of(found, C.PLURAL)
                                                             if v >= compacted] and found,
        timeout=SETTLE_SECONDS * 2, interval=1, what="kopf watching DDPJobs again past the compaction")
    resumed = watches_of(requests, C.PLURAL)
    assert resumed[0] < compacted, f"kopf resumed its watch from before the compaction: {resumed}"
    first_list = next(i for i, r in enumerate(requests) if (r.verb, r.resource) == ("list", C.PLURAL))
    first_stale = next(i for i, r in enumerate(requests) if (r.verb, r.resource) == ("watch", C.PLURAL))
    assert first_stale < first_list, "the 410 Gone came first, then the list"
    # It goes on: a job made now gets its pods from the operator.
    start_example(faulty.installed, "after")
    wait(faulty.installed, lambda: pods_created_by(faulty.control_plane, kube.namespace, "after-"), 120,
         "the operator creating the pods of a job made after the compaction")
    assert_never_restarted(faulty, container)
    assert faulty.proxy.stats.refused - refused_at <= 10, "reconnecting backs off while refused"
