"""What the operator benches share on the real control plane (issue 22): the control plane with
status-only Nodes, the chart's operator as a local process under the chart's ServiceAccount,
the control plane's own processes' CPU and memory, and the API server's audit log counted per client.

Why the operator runs as a local process and not as the Deployment's pod: the benches read its
/proc (CPU seconds, RSS and peak) and its metrics port, and start a fresh one per measured size;
as a pod it would need a kubelet that runs processes (ddpjob_sandbox.control_plane.kubelets),
whose own polling shares the machine's 2 cores with what is measured. What the install decides
stays the chart's: ``helm template`` renders it with the bench's values, every object but the
Deployment is applied (CRD, ServiceAccount, RBAC), and the Deployment's own args run under a
token of its ServiceAccount, so every request is authorized by the chart's RBAC, never as admin.
"""
from __future__ import annotations

import contextlib
import json
import os
import pathlib
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import yaml

from ddpjob_sandbox.client import ApiError, KubeClient
from ddpjob_sandbox.control_plane import ControlPlane, audit, running_control_plane
from ddpjob_sandbox.control_plane.runner import state_path
from ddpjob_sandbox.control_plane.status_nodes import StatusNode, default_pod_ip, running_status_nodes, \
    status_node_names

REPO = pathlib.Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "ddpjob-operator"
KUBE_VERSION = "1.37.2"  # the pinned release (scripts/cluster), for helm template's kubeVersion check
RELEASE = "ddpjob"
TOKEN_SECONDS = 3 * 3600


@dataclass
class BenchCluster:
    """A running control plane, its status-only Nodes and an admin client per namespace."""

    control_plane: ControlPlane
    nodes: list[StatusNode] = field(default_factory=list)

    def client(self, namespace: str) -> KubeClient:
        return self.control_plane.client(namespace)

    def namespace(self, name: str, restricted: bool = True) -> KubeClient:
        """A namespace that enforces Pod Security `restricted` (as the cluster tests'), once its
        `default` ServiceAccount exists (the ServiceAccount admission refuses pods before)."""
        kube = self.client(name)
        labels = {"pod-security.kubernetes.io/enforce": "restricted"} if restricted else {}
        kube.create("namespaces", {"metadata": {"name": name, "labels": labels}})
        kube.wait_for(lambda: kube.find("serviceaccounts", "default"), timeout=60, what=f"{name}'s default account")
        return kube

    def component_pids(self) -> dict[str, int]:
        processes = json.loads(state_path(self.control_plane.layout.root).read_text())["processes"]
        return {name: entry["pid"] for name, entry in processes.items()}


@contextlib.contextmanager
def bench_cluster(root: pathlib.Path, nodes: int, pod_ip: Callable[[dict], str] = default_pod_ip
                  ) -> Iterator[BenchCluster]:
    """The real control plane with ``nodes`` status-only Nodes (pods reported Running at ``pod_ip``)."""
    with running_control_plane(root / "control-plane") as control_plane, \
            running_status_nodes(control_plane.layout, status_node_names(nodes), pod_ip=pod_ip) as running:
        yield BenchCluster(control_plane, running)


@dataclass(frozen=True)
class ChartOperator:
    """The chart's operator for a local process: its argv, the kubeconfig of its ServiceAccount,
    and the name the API server knows it by (the audit log's user)."""

    argv: list[str]
    kubeconfig: pathlib.Path  # OperatorProcess reads .kubeconfig
    user: str


def chart_operator(cluster: BenchCluster, namespace: str, values: Mapping[str, object],
                   workdir: pathlib.Path) -> ChartOperator:
    """Renders the chart into ``namespace`` with ``values`` (helm --set-json each), applies all but
    the Deployment, and returns the Deployment's command under a token of its ServiceAccount."""
    layout = cluster.control_plane.layout
    sets = [a for key, value in values.items() for a in ("--set-json", f"{key}={json.dumps(value)}")]
    rendered = subprocess.run([str(layout.bin_dir / "helm"), "template", RELEASE, str(CHART), "--namespace", namespace,
                               "--kube-version", KUBE_VERSION, "--include-crds", *sets],
                              capture_output=True, text=True, timeout=120)
    if rendered.returncode != 0:
        raise RuntimeError(f"helm template: {rendered.stderr}")
    documents = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    (deployment,) = [d for d in documents if d["kind"] == "Deployment"]
    others = workdir / f"chart-{uuid.uuid4().hex[:6]}.yaml"
    others.write_text(yaml.safe_dump_all([d for d in documents if d["kind"] != "Deployment"]))
    kube = cluster.client(namespace)
    kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(others))
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    account = pod["serviceAccountName"]
    token = _token(kube, account, namespace)
    kubeconfig = workdir / f"{account}.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "bench",
        "clusters": [{"name": "bench", "cluster": {"server": layout.apiserver_url,
                                                   "certificate-authority": str(layout.pki / "ca.crt")}}],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": account, "namespace": namespace}}]}))
    argv = [sys.executable if a == "python" else a for a in container["command"]] + list(container["args"])
    return ChartOperator(argv, kubeconfig, f"system:serviceaccount:{namespace}:{account}")


def _token(kube: KubeClient, account: str, namespace: str) -> str:
    """A token of the ServiceAccount (TokenRequest), as the pod's projected token would be."""
    path = kube.path("serviceaccounts", account, namespace, "token")
    kube.wait_for(lambda: kube.find("serviceaccounts", account, namespace), timeout=30, what=f"ServiceAccount {account}")
    try:
        answer = kube.request("POST", path, {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                                             "spec": {"expirationSeconds": TOKEN_SECONDS}})
    except ApiError as e:
        raise RuntimeError(f"no token for ServiceAccount {namespace}/{account}: {e}") from None
    return answer["status"]["token"]


def arg_value(argv: list[str], flag: str) -> str:
    """The value of ``--flag=value`` in a rendered argv (what the chart decided)."""
    values = [a.split("=", 1)[1] for a in argv if a.startswith(f"{flag}=")]
    if not values:
        raise KeyError(f"{flag} not in the chart's args {argv}")
    return values[-1]


class AuditLog:
    """The API server's audit log of one bench cluster, counted per client over byte-offset
    windows (control_plane/audit.py: a request counts once, in the window of its first event)."""

    def __init__(self, path: pathlib.Path):
        self.path = path

    def mark(self) -> int:
        return audit.mark(self.path)

    def counts(self, start: int, end: int, user: str, resource: str | None = None,
               subresource: str | None = None) -> Counter:
        """Requests by verb (list, get, watch, create, patch, update, delete) of ``user``."""
        where = {k: v for k, v in {"resource": resource, "subresource": subresource}.items() if v is not None}
        return audit.count(audit.requests(self.path, start, end), by=("verb",), user=user, **where)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process, from its /proc stat line."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> tuple[float, float]:
    """Current and peak resident set size of ``pid`` in MB (from /proc)."""
    fields = dict(line.split(":", 1) for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines()
                  if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


class Watched:
    """One collection as list-then-watch shows it (name -> the latest object), as an informer keeps
    it: when the API server ends the watch (its timeout, or a watcher too slow for its buffer, which
    a loaded machine makes), it watches again from the last version seen, and lists again on 410
    Gone. ``on_change(objects)`` runs under the lock after each change; waits are on this copy,
    never a list in a loop."""

    def __init__(self, kube: KubeClient, path: str, on_change: Callable[[dict[str, dict]], None] | None = None,
                 label_selector: str = ""):
        self.kube, self.path, self.on_change, self.selector = kube, path, on_change, label_selector
        self.objects: dict[str, dict] = {}
        self.changed = threading.Condition()
        self.errors: list[str] = []
        self._closed = threading.Event()
        self._response = None
        listed = threading.Event()
        threading.Thread(target=self._run, args=(listed,), daemon=True, name=f"watch {path}").start()
        listed.wait(120)

    def _url(self, **params: str) -> str:
        query = {"labelSelector": self.selector, **params} if self.selector else params
        return f"{self.kube.url}{self.path}?{urllib.parse.urlencode(query)}"

    def _run(self, listed: threading.Event) -> None:
        version = None
        while not self._closed.is_set():
            try:
                if version is None:
                    with urllib.request.urlopen(self._url(), timeout=120, context=self.kube.ssl_context) as response:
                        body = json.load(response)
                    with self.changed:
                        self.objects = {o["metadata"]["name"]: o for o in body["items"]}
                        self._changed()
                    version = body["metadata"]["resourceVersion"]
                    listed.set()
                version = self._watch(version)
            except (OSError, ValueError) as e:
                if not self._closed.is_set():
                    self.errors.append(repr(e))
                    time.sleep(1.0)

    def _watch(self, version: str) -> str | None:
        """Applies the watch's events from ``version``; returns the last version seen (None: list again)."""
        url = self._url(watch="true", resourceVersion=version, allowWatchBookmarks="true", timeoutSeconds="300")
        with urllib.request.urlopen(url, timeout=330, context=self.kube.ssl_context) as response:
            self._response = response
            for line in response:
                event = json.loads(line)
                obj = event["object"]
                if event["type"] == "ERROR":
                    return None  # 410 Gone: the version was compacted
                with self.changed:
                    if event["type"] == "DELETED":
                        self.objects.pop(obj["metadata"]["name"], None)
                    elif event["type"] in ("ADDED", "MODIFIED"):
                        self.objects[obj["metadata"]["name"]] = obj
                    self._changed()
                version = obj["metadata"]["resourceVersion"]
        return version

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change(self.objects)
        self.changed.notify_all()

    def wait(self, predicate: Callable[[dict[str, dict]], object], timeout: float, what: str) -> object:
        """Waits until ``predicate(objects)`` is truthy; returns it (RuntimeError naming ``what`` after ``timeout``)."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while not (value := predicate(self.objects)):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}; have: "
                                       f"{sorted(self.objects)[:20]}; watch errors: {self.errors[-3:]}")
                self.changed.wait(min(left, 1.0))
            return value

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(Exception):
            self._response.fp.raw._sock.shutdown(2)  # ends the blocking read


def pod_watch(kube: KubeClient) -> Watched:
    """The pods of ``kube``'s namespace."""
    return Watched(kube, kube.path("pods"))
