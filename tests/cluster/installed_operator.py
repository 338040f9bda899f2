"""The operator installed with the real `helm install` of charts/ddpjob-operator on the test
control plane, and what the cluster tests of it share: bounded waits that dump the cluster state
on failure, the test-speed c10d example, the audit log's record of who created a job's pods.

The fixture ``installed`` (tests/cluster/conftest.py) wraps :func:`installed_operator`, one
install per test module; the fixture ``operator`` (tests/cluster/operators.py) keeps one install
per set of operator flags for the whole session.
"""
from __future__ import annotations

import collections
import contextlib
import json
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any
from dataclasses import dataclass
from pathlib import Path

import pytest

from ddpjob_operator.api import constants as C
from ddpjob_sandbox.client import KubeClient
from ddpjob_sandbox.control_plane import BUILD_COMMAND, DEFAULT_BIN_DIR, ControlPlane, audit
from ddpjob_sandbox.control_plane.cluster import make_volumes
from ddpjob_sandbox.control_plane.kubelets import NODE_LABEL
from ddpjob_sandbox.examples import EXAMPLES, example_job, kubectl_apply, trainer_args
from ddpjob_sandbox.procs import free_port
from tests.cluster.crds import REPO, chart_crd, install_crd

HELM = DEFAULT_BIN_DIR / "helm"
CHART = REPO / "charts" / "ddpjob-operator"
RELEASE = "ddpjob"


def operator_selector(release: str) -> str:
    """The label selector of release ``release``'s operator pods."""
    return f"app.kubernetes.io/name=ddpjob-operator,app.kubernetes.io/instance={release}"


OPERATOR_SELECTOR = operator_selector(RELEASE)
OPERATOR_READY_SECONDS = 120  # scheduling + the operator importing kopf on a busy 2-core machine
STATUS_WRITE_INTERVAL_SECONDS = 5
JOB_SECONDS = 240  # 2 torchrun agents and their workers importing torch, then a short training (~2 min at load 19)


@dataclass(frozen=True)
class Installed:
    kube: KubeClient
    account: str  # the operator's ServiceAccount, as the API server names its user
    workdir: Path
    kubelets: list
    release: str = RELEASE

    def operator_log(self, chars: int = 4000) -> str:
        """The operator pod's log, read from its kubelet (the sandbox's Nodes have no address for
        `kubectl logs`); empty before it ran."""
        return operator_log(self.kube.namespace, self.kubelets, chars)

    def containers(self, pod: str) -> list:
        """Every container its kubelet started for operator pod ``pod`` (none before it ran, or
        once its kubelet removed it)."""
        return [c for k in self.kubelets for c in list(k.agent.pods.values())
                if (c.namespace, c.name) == (self.kube.namespace, pod)]

    def pod_log(self, pod: str, chars: int = 10**8) -> str:
        """The log of operator pod ``pod`` alone, from its kubelet ("" before it ran, or once its
        kubelet removed it)."""
        return "\n".join(c.log(chars) for c in self.containers(pod))


def helm(control_plane: ControlPlane, *args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([str(HELM), "--kubeconfig", str(control_plane.kubeconfig), *args],
                          capture_output=True, text=True, timeout=OPERATOR_READY_SECONDS + 60)
    assert done.returncode == 0, f"helm {' '.join(args)}: {done.stderr}"
    return done


@contextlib.contextmanager
def installed_operator(control_plane: ControlPlane, kubelets, tmp_path_factory, *, release: str = RELEASE,
                       extra_args: tuple[str, ...] = (), extra_env: dict[str, str] | None = None,
                       values: dict[str, Any] | None = None, watch: list[str] | None = None) -> Iterator[Installed]:
    """The chart installed as ``release`` in a namespace of its own that enforces Pod Security
    `restricted`, with hostPath volumes for the examples' claims, watching only that namespace;
    ``extra_args`` are further operator flags (the chart's extraArgs). Releases installed side by
    side need distinct names: the chart's ClusterRole for Nodes is named after the release.
    ``extra_env``: the operator's further environment (the chart's extraEnv); ``values``: further
    chart values (rbac, peering, ...); ``watch``: its watchNamespaces instead of its own namespace
    ([]: every namespace)."""
    if not HELM.exists():
        pytest.fail(f"the operator tier needs {HELM}: build it with {BUILD_COMMAND}", pytrace=False)
    workdir = tmp_path_factory.mktemp("operator-on-cluster")
    kube = control_plane.client(namespace=f"ddpjob-{uuid.uuid4().hex[:6]}")
    kube.create("namespaces", {"metadata": {"name": kube.namespace, "labels": {
        "pod-security.kubernetes.io/enforce": "restricted"}}})
    kube.wait_for(lambda: kube.find("serviceaccounts", "default"), timeout=30, what="the default service account")
    install_crd(kube, chart_crd())  # the corpus tests may have left a variant of it
    make_volumes(kube, workdir / "volumes", prefix=f"{kube.namespace}-pv")
    helm(control_plane, "install", release, str(CHART), "--namespace", kube.namespace, "--wait",
         "--timeout", f"{OPERATOR_READY_SECONDS}s",
         "--set-json", "watchNamespaces=" + json.dumps([kube.namespace] if watch is None else watch),
         "--set", f"livenessPort={free_port()}",
         "--set", "progressPollSeconds=2", "--set-json", f'nodeSelector={json.dumps({NODE_LABEL: "true"})}',
         # Progress and status.lastSnapshot are written at most once per this interval (decide/writes.py;
         # 600 s by default): the tests wait for a first snapshot to act mid-run.
         "--set-json", "extraArgs=" + json.dumps([
             f"--status-write-interval-seconds={STATUS_WRITE_INTERVAL_SECONDS}", *extra_args]),
         "--set-json", "extraEnv=" + json.dumps([{"name": k, "value": v} for k, v in (extra_env or {}).items()]),
         *(arg for key, value in (values or {}).items() for arg in ("--set-json", f"{key}={json.dumps(value)}")))
    (deployment,) = kube.list("deployments", label_selector=operator_selector(release))
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    try:
        yield Installed(kube, f"system:serviceaccount:{kube.namespace}:{account}", workdir, kubelets, release)
    finally:
        subprocess.run([str(HELM), "--kubeconfig", str(control_plane.kubeconfig), "uninstall", release,
                        "--namespace", kube.namespace, "--wait", "--timeout", "60s"], capture_output=True, timeout=90)
        kube.delete("namespaces", kube.namespace)


def wait(installed: Installed, predicate, timeout: float, what: str):
    """kube.wait_for (the predicate's truthy value), failing with the diagnosis of that moment."""
    try:
        return installed.kube.wait_for(predicate, timeout=timeout, interval=0.5, what=what)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{diagnosis(installed.kube, installed.kubelets)}") from None


def operator_log(namespace: str, kubelets, chars: int = 4000) -> str:
    """The log of the operator pods in ``namespace`` (each release has a namespace of its own),
    from their kubelets: the sandbox's Nodes have no address for `kubectl logs`."""
    return "\n".join(c.log(chars) for k in kubelets for c in list(k.agent.pods.values())
                     if c.namespace == namespace and "-ddpjob-operator-" in c.name)


def diagnosis(kube: KubeClient, kubelets) -> str:
    """What a failed wait shows: the operator's log, the jobs' status, the Events, the pods and
    budgets as stored, the kubelets' errors."""
    operator_log_text = operator_log(kube.namespace, kubelets)
    pods = [(p["metadata"]["name"], p["spec"].get("nodeName"), (p.get("status") or {}).get("phase"),
             p["metadata"].get("deletionTimestamp")) for p in kube.list("pods")]
    jobs = {j["metadata"]["name"]: j.get("status") for j in kube.list("ddpjobs")}
    events = [(e["involvedObject"]["name"], e["reason"], e["message"]) for e in kube.list("events")][-15:]
    errors = {k.name: k.agent.errors[-3:] for k in kubelets}
    budgets = [(b["metadata"]["name"], b["spec"], b.get("status")) for b in kube.list("poddisruptionbudgets")]
    return (f"operator log:\n{operator_log_text}\njobs: {jobs}\nevents: {events}\npods: {pods}\nbudgets: {budgets}\n"
            f"kubelet errors: {errors}")


def audit_offset(control_plane: ControlPlane) -> int:
    """Where the audit log ends now: :func:`requests_by` from here counts what comes after."""
    return control_plane.layout.audit_log.stat().st_size


def audit_events(control_plane: ControlPlane, since: int = 0) -> list[dict]:
    """The API server's audit events (oldest first) from the audit log's offset ``since``, each
    request once, complete."""
    with control_plane.layout.audit_log.open("rb") as log:
        log.seek(since)
        lines = log.read().decode(errors="replace").splitlines()
    events = []
    for line in lines:
        with contextlib.suppress(ValueError):  # a line the server is writing now
            event = json.loads(line)
            if event.get("stage") == "ResponseComplete":
                events.append(event)
    return events


def requests_by(control_plane: ControlPlane, user: str, since: int = 0) -> collections.Counter:
    """How many requests of each verb (get, list, watch, create, patch, ...) ``user`` made since the
    audit log's offset ``since``."""
    return collections.Counter(e["verb"] for e in audit_events(control_plane, since) if e["user"]["username"] == user)


def pod_creates(control_plane: ControlPlane, namespace: str, prefix: str) -> list[dict]:
    """The audit events of every create, admitted or refused, of a pod ``<prefix>*`` in ``namespace``."""
    return [e for e in audit_events(control_plane)
            if (e.get("verb"), (e.get("objectRef") or {}).get("resource"), (e.get("objectRef") or {}).get("namespace"),
                (e.get("objectRef") or {}).get("subresource")) == ("create", "pods", namespace, None)
            and (e.get("objectRef") or {}).get("name", "").startswith(prefix)]


def pods_created_by(control_plane: ControlPlane, namespace: str, prefix: str) -> set[str]:
    """Who created the pods ``<prefix>*`` in ``namespace``, from the API server's audit log."""
    return {r.user for r in audit.requests(control_plane.layout.audit_log)
            if (r.verb, r.resource, r.subresource, r.namespace, r.code) == ("create", "pods", "", namespace, 201)
            and r.name.startswith(prefix)}


def job_phase(kube: KubeClient, name: str = "mlp") -> str | None:
    return (kube.get("ddpjobs", name).get("status") or {}).get("phase")


SHORT = trainer_args(epochs=2, samples=512, step_sleep=0.05, snapshot_every_steps=4)  # 16 steps
# 96 steps of at least 0.2 s: long enough that the operator polls a snapshot before the end.
LONGER = trainer_args(epochs=3, samples=2048, step_sleep=0.2, snapshot_every_steps=8)


def example_body(name: str, args: list[str] = SHORT) -> dict:
    """The test-speed c10d example (example_job names its overrides) as DDPJob ``name``, its node
    pods on the kubelets' Nodes (not bare ones)."""
    body = example_job(args=args, rdzv_port=free_port())
    body["metadata"]["name"] = name
    body["spec"]["scheduling"] = {"nodeSelector": {NODE_LABEL: "true"}}
    return body


def submit(installed: Installed, body: dict) -> dict:
    """snapshot-pvc.yaml and then ``body``, each with `kubectl apply` as a user does."""
    installed.kube.kubectl("apply", "-f", str(EXAMPLES / "snapshot-pvc.yaml"))
    kubectl_apply(installed.kube, body, installed.workdir)
    return body


def start_example(installed: Installed, name: str, args: list[str] = SHORT) -> dict:
    return submit(installed, example_body(name, args))


def wait_finished(installed: Installed, name: str) -> dict:
    kube = installed.kube
    wait(installed, lambda: job_phase(kube, name) in C.FINISHED_PHASES, JOB_SECONDS, f"DDPJob {name} finishing")
    return kube.get("ddpjobs", name)["status"]
