"""The helm-installed operator shared by many tests, without a helm install per test or per module.

:class:`Releases` (the session fixture ``operator_releases``) installs the chart once per set of
operator flags a test asks for (``@pytest.mark.operator_args("--flag", "value")``, passed through
the chart's ``extraArgs``), each release in a namespace of its own that enforces Pod Security
`restricted` and is the only one it watches, the operator running as its Deployment's pod under
the chart's ServiceAccount (installed_operator). The fixture ``operator`` hands a test
:class:`Operated`: the admin's client in that namespace and a job name no other test uses; after
the test it deletes the DDPJobs the test made and waits until their pods are gone, so the next test
of that release starts clean, and fails the test if the operator logged a traceback meanwhile.

Pods whose status the test writes (a kubelet's part, as ddpjob_sandbox.scripted does) go to the
status-only Nodes (ddpjob_sandbox.control_plane.status_nodes) with :func:`on_status_nodes`.
"""
from __future__ import annotations

import contextlib
import itertools
import json
import sys
import uuid
from dataclasses import dataclass
from typing import Any

from ddpjob_operator.api import constants as C
from ddpjob_sandbox.client import ApiError, KubeClient
from ddpjob_sandbox.control_plane import ControlPlane
from ddpjob_sandbox.control_plane.scripted_nodes import STATUS_ONLY_LABEL, STATUS_ONLY_TOLERATION
from ddpjob_sandbox.jobs import make_manifest
from ddpjob_sandbox.scripted import set_running, set_terminated
from tests.cluster.installed_operator import OPERATOR_READY_SECONDS, Installed, diagnosis, installed_operator, wait

STATUS_ONLY_NODES = ("status-0", "status-1", "status-2")
CLEAN_SECONDS = 60  # the operator's finalizer, the garbage collector and the Nodes removing the pods
LOG_CHARS = 10**8  # the whole operator log: a test's part of it is what follows its start
# An etcd-v3 job's deletion waits for the operator's finalizer to clean its rendezvous keys: three
# attempts of 10 s against an etcd that is not there (these tests' jobs name one that never runs)
# held each clean-up 40 s. One attempt of 1 s keeps the same path at test speed.
RELEASE_ENV = {"DDPJOB_RDZV_CLEANUP_TIMEOUT_SECONDS": "1"}


class Releases:
    """Helm releases of the chart, one per tuple of extra operator flags and further chart values,
    installed on first use and uninstalled when the session ends."""

    def __init__(self, control_plane: ControlPlane, kubelets, tmp_path_factory):
        self._control_plane, self._kubelets, self._tmp = control_plane, kubelets, tmp_path_factory
        self._stack = contextlib.ExitStack()
        self._by_args: dict[tuple[tuple[str, ...], str], Installed] = {}
        self._numbers = itertools.count()

    def get(self, args: tuple[str, ...] = (), values: dict[str, Any] | None = None) -> Installed:
        key = (args, json.dumps(values or {}, sort_keys=True))
        if key not in self._by_args:
            # Distinct release names: the chart names its ClusterRole for Nodes after the release.
            self._by_args[key] = self._stack.enter_context(installed_operator(
                self._control_plane, self._kubelets, self._tmp, release=f"ddpjob-s{next(self._numbers)}",
                extra_args=args, extra_env=RELEASE_ENV, values=values))
            wait_handling_jobs(self._by_args[key])
        return self._by_args[key]

    def close(self) -> None:
        self._stack.close()


def wait_handling_jobs(installed: Installed) -> None:
    """Waits until the operator handles jobs: `helm install --wait` saw its pod Ready, which kopf
    answers before its watches have listed (on a loaded machine, many seconds before). A
    suspended job it reports Suspended proves it, and costs no pod."""
    kube, name = installed.kube, f"ready-{uuid.uuid4().hex[:6]}"
    kube.create("ddpjobs", status_manifest(name, replicas=1, runPolicy={"suspend": True}))
    wait(installed, lambda: (kube.get("ddpjobs", name).get("status") or {}).get("phase") == C.PHASE_SUSPENDED,
         OPERATOR_READY_SECONDS, "the operator handling a first job")
    kube.delete("ddpjobs", name)
    wait(installed, lambda: kube.find("ddpjobs", name) is None, CLEAN_SECONDS, "the first job gone")


@dataclass(frozen=True)
class Operated:
    """What a test of the shared operator holds: its release and a job name of its own."""

    installed: Installed
    job: str  # unique in the session: pods, Events and the audit log of earlier tests never match it

    @property
    def kube(self) -> KubeClient:
        return self.installed.kube

    @property
    def account(self) -> str:
        return self.installed.account

    def name(self, stem: str) -> str:
        """A second job name of this test's own (``<job>-<stem>``)."""
        return f"{self.job}-{stem}"

    def diagnosis(self) -> str:
        return diagnosis(self.kube, self.installed.kubelets)


def unique_job_name() -> str:
    return f"j{uuid.uuid4().hex[:6]}"


def on_status_nodes(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` (a DDPJob manifest) with its node pods on the status-only Nodes, whose status the
    test writes; the rest of its scheduling is kept."""
    scheduling = body["spec"].setdefault("scheduling", {})
    scheduling["nodeSelector"] = {**scheduling.get("nodeSelector", {}), STATUS_ONLY_LABEL: "true"}
    scheduling["tolerations"] = [*scheduling.get("tolerations", []), dict(STATUS_ONLY_TOLERATION)]
    return body


def status_manifest(name: str, **fields: Any) -> dict[str, Any]:
    """make_manifest's DDPJob ``name`` on the status-only Nodes; a c10d job keeps its store in node
    0 (rdzvStore node) unless ``elasticPolicy`` says otherwise.

    Why: a store pod borrows the node pods' tolerations but not their nodeSelector (render/common.py
    borrowed_scheduling), so the scheduler may put it on a kubelet's Node, which runs it for real
    (torch imported, a 5 s graceful stop at clean-up). A test about the store pod asks for it with
    ``elasticPolicy={"rdzvStore": "pod"}`` and reads or stops it as it runs."""
    elastic = dict(fields.pop("elasticPolicy", {}))
    if elastic.get("rdzvBackend", "c10d") == "c10d":
        elastic.setdefault("rdzvStore", "node")
    return on_status_nodes(make_manifest(name, elasticPolicy=elastic, **fields))


def kubelet_container(operator: Operated, pod: dict):
    """The process of ``pod`` where a kubelet runs it, else None (a status-only Node's pod)."""
    return next((c for k in operator.installed.kubelets if k.name == pod["spec"].get("nodeName")
                 for c in list(k.agent.pods.values()) if c.uid == pod["metadata"]["uid"]), None)


def store_running(operator: Operated, store: str) -> None:
    """The store pod runs: a store pod borrows the node pods' tolerations, not their nodeSelector
    (render/common.py), so the scheduler may put it on a kubelet's Node, which runs it; on a
    status-only Node the test reports it running."""
    kube = operator.kube
    pod = kube.wait_for(lambda: (p := kube.find("pods", store)) and p["spec"].get("nodeName") and p, timeout=30,
                        what="the store pod created and placed by the scheduler")
    if pod["spec"]["nodeName"] in {k.name for k in operator.installed.kubelets}:
        kube.wait_for(lambda: (kube.get("pods", store).get("status") or {}).get("phase") == "Running", timeout=60,
                      what="the kubelet running the store pod")
    else:
        set_running(kube, store)


def fail_store(operator: Operated, store: str) -> None:
    """The store pod's container dies: killed on its kubelet, or reported exited 1 on a status-only Node."""
    pod = operator.kube.get("pods", store)
    container = kubelet_container(operator, pod)
    if container is not None:
        container.kill()
    else:
        set_terminated(operator.kube, store, 1)


def leftovers(kube: KubeClient) -> list[str]:
    """The DDPJobs and their pods still in the namespace (the operator's own pod is not a job's)."""
    jobs = [f"ddpjob/{j['metadata']['name']}" for j in kube.list("ddpjobs")]
    pods = [f"pod/{p['metadata']['name']}" for p in kube.list("pods", label_selector=C.LABEL_JOB_NAME)]
    return jobs + pods


def clean(operated: Operated) -> None:
    """Deletes every DDPJob of the namespace and waits until they and their pods are gone."""
    kube = operated.kube
    for job in kube.list("ddpjobs"):
        with contextlib.suppress(ApiError):  # 404: deleted meanwhile
            kube.delete("ddpjobs", job["metadata"]["name"], propagationPolicy="Background")
    try:
        kube.wait_for(lambda: not kube.list("ddpjobs"), timeout=CLEAN_SECONDS, interval=0.1,
                      what="the test's DDPJobs gone")
        # The garbage collector would delete the pods too, seconds later on a busy machine (5-7 s
        # measured at load 10); deleting them at once keeps the next test from waiting on it. Only
        # once the jobs are gone: an operator that saw a pod go before its job would replace it.
        # The collector itself is proven by the tests that delete a job (test_operator_policies.py).
        kube.request("DELETE", kube.path("pods"), params={"labelSelector": C.LABEL_JOB_NAME})
        kube.wait_for(lambda: not leftovers(kube), timeout=CLEAN_SECONDS, interval=0.2,
                      what="the test's DDPJobs and their pods gone")
    except AssertionError as e:
        raise AssertionError(f"{e}\n{operated.diagnosis()}") from None


@contextlib.contextmanager
def operated(releases: Releases, args: tuple[str, ...], values: dict[str, Any] | None = None):
    installed = releases.get(args, values)
    start = len(installed.operator_log(LOG_CHARS))
    running = Operated(installed, unique_job_name())
    try:
        yield running
    finally:
        try:
            clean(running)
        finally:
            log = installed.operator_log(LOG_CHARS)[start:]
            sys.stdout.write(f"\n--- operator log ({installed.release}, this test's part) ---\n{log[-20000:]}\n")
    assert "Traceback" not in log, f"the operator raised an unexpected exception:\n{log[-5000:]}"

