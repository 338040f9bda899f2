"""Runs the Kubernetes API emulator and the real operator for integration tests.

``running_cluster()`` serves a :class:`KubeEmulator` on a free loopback port from a background
thread (its own event loop), registers the DDPJob CRD and writes a kubeconfig for kubectl and
kopf. ``running_operator()`` starts ``python -m ddpjob_operator`` (or any kopf module) as a
subprocess in its own process group, logged in to the emulator through that kubeconfig, the
same way it logs in to a real cluster. Tests talk to the API over HTTP through :class:`KubeClient`.

Fixtures: ``cluster`` (one emulator per test), ``k8s`` (its client, with a fresh namespace)
and ``operator`` (a started operator in that namespace).
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pathlib
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import kmock
import pytest
import yaml

from tests.support.kube_emulator import KubeEmulator
from tests.support.procs import start_in_own_group, stop_process_group

REPO = pathlib.Path(__file__).resolve().parents[2]
CRD_PATH = REPO / "manifests" / "crds" / "ddpjobs.ddpjob.io.yaml"

# Resource name -> (API path prefix, namespaced). Only what the tests use.
RESOURCES: dict[str, tuple[str, bool]] = {
    "pods": ("/api/v1", True),
    "services": ("/api/v1", True),
    "events": ("/api/v1", True),
    "configmaps": ("/api/v1", True),
    "namespaces": ("/api/v1", False),
    "nodes": ("/api/v1", False),
    "events.k8s.io": ("/apis/events.k8s.io/v1", True),
    "networkpolicies": ("/apis/networking.k8s.io/v1", True),
    "ddpjobs": ("/apis/ddpjob.io/v1alpha1", True),
    "customresourcedefinitions": ("/apis/apiextensions.k8s.io/v1", False),
    "kopfpeerings": ("/apis/kopf.dev/v1", True),
}


def load_crd() -> dict:
    """The generated CRD manifest (as ``kubectl apply`` would install it), else the generator's output."""
    if CRD_PATH.exists():
        return yaml.safe_load(CRD_PATH.read_text())
    from ddpjob_operator.api.crd import build_crd

    return build_crd()


class ApiError(Exception):
    """An API call answered with an HTTP error; ``status`` and the ``Status`` body are kept."""

    def __init__(self, status: int, body: Any, what: str):
        self.status = status
        self.body = body
        reason = body.get("reason") if isinstance(body, dict) else None
        message = body.get("message") if isinstance(body, dict) else body
        super().__init__(f"{what} -> HTTP {status} {reason}: {message}")


class KubeClient:
    """A small synchronous API client for tests (urllib; nothing shared with the operator)."""

    def __init__(self, url: str, kubeconfig: pathlib.Path, namespace: str = "default"):
        self.url = url.rstrip("/")
        self.kubeconfig = kubeconfig
        self.namespace = namespace

    def path(self, resource: str, name: str | None = None, namespace: str | None = None,
             subresource: str | None = None) -> str:
        prefix, namespaced = RESOURCES[resource]
        plural = resource.split(".")[0] if "." in resource else resource
        parts = [prefix]
        if namespaced:
            parts += ["namespaces", namespace or self.namespace]
        parts.append(plural)
        if name:
            parts.append(name)
        if subresource:
            parts.append(subresource)
        return "/".join(parts)

    def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
                params: Mapping[str, str] | None = None, timeout: float = 10) -> Any:
        url = self.url + path + ("?" + urllib.parse.urlencode(params) if params else "")
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": content_type})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                text = response.read()
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                payload = json.loads(raw)
            except ValueError:
                payload = raw.decode(errors="replace")
            raise ApiError(e.code, payload, f"{method} {path}") from None
        return json.loads(text) if text else None

    def create(self, resource: str, body: Mapping[str, Any], namespace: str | None = None) -> dict:
        return self.request("POST", self.path(resource, namespace=namespace), body)

    def get(self, resource: str, name: str, namespace: str | None = None, subresource: str | None = None) -> dict:
        return self.request("GET", self.path(resource, name, namespace, subresource))

    def find(self, resource: str, name: str, namespace: str | None = None) -> dict | None:
        """The object, or None where it does not exist."""
        try:
            return self.get(resource, name, namespace)
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def list(self, resource: str, namespace: str | None = None, label_selector: str = "",
             field_selector: str = "") -> list[dict]:
        params = {k: v for k, v in {"labelSelector": label_selector, "fieldSelector": field_selector}.items() if v}
        return self.request("GET", self.path(resource, namespace=namespace), params=params)["items"]

    def patch(self, resource: str, name: str, patch: Any, namespace: str | None = None,
              subresource: str | None = None, patch_type: str = "merge") -> dict:
        content_type = {"merge": "application/merge-patch+json", "json": "application/json-patch+json",
                        "strategic": "application/strategic-merge-patch+json"}[patch_type]
        return self.request("PATCH", self.path(resource, name, namespace, subresource), patch, content_type)

    def replace(self, resource: str, name: str, body: Mapping[str, Any], namespace: str | None = None,
                subresource: str | None = None) -> dict:
        return self.request("PUT", self.path(resource, name, namespace, subresource), body)

    def delete(self, resource: str, name: str, namespace: str | None = None, **options: Any) -> dict:
        return self.request("DELETE", self.path(resource, name, namespace), options or None)

    def wait_for(self, predicate: Callable[[], Any], timeout: float = 30, interval: float = 0.05,
                 what: str = "condition") -> Any:
        """Polls ``predicate`` until it returns something truthy; fails the test with ``what`` after ``timeout``."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            last = predicate()
            if last:
                return last
            time.sleep(interval)
        pytest.fail(f"timed out after {timeout} s waiting for {what}; last value: {last!r}")

    def kubectl(self, *args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
        """Runs kubectl against the emulator in this client's namespace."""
        command = ["kubectl", "--kubeconfig", str(self.kubeconfig), "--namespace", self.namespace, *args]
        result = subprocess.run(command, capture_output=True, text=True, input=input, timeout=60)
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(command)} exited {result.returncode}:\n{result.stderr}")
        return result


class EmulatorThread:
    """Serves an emulator on loopback from a background thread with its own event loop."""

    def __init__(self, emulator: KubeEmulator):
        self.emulator = emulator
        self.url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="kube-emulator", daemon=True)

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(timeout=30) or self._error is not None:
            raise RuntimeError(f"the Kubernetes emulator did not start: {self._error!r}")

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=30)

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as e:  # reported to start() instead of dying silently in the thread
            self._error = e
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with self.emulator, kmock.Server(self.emulator) as server:
            self.url = str(server.url).rstrip("/")
            self._ready.set()
            await self._stop.wait()
            # Close watch streams before the server shuts down, else it waits for them.
            for task in asyncio.all_tasks() - {asyncio.current_task()}:
                task.cancel()


def write_kubeconfig(path: pathlib.Path, url: str, namespace: str = "default") -> pathlib.Path:
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "emulator",
        "clusters": [{"name": "emulator", "cluster": {"server": url}}],
        "users": [{"name": "tester", "user": {"token": "emulator-accepts-any-token"}}],
        "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "tester",
                                                      "namespace": namespace}}],
    }
    path.write_text(yaml.safe_dump(config))
    return path


class Cluster:
    """A running emulator, its kubeconfig and a client."""

    def __init__(self, workdir: pathlib.Path):
        self.emulator = KubeEmulator()
        self.emulator.register_crd(load_crd())
        self._thread = EmulatorThread(self.emulator)
        self.workdir = workdir
        self.kubeconfig = workdir / "kubeconfig"
        self.url = ""

    def __enter__(self) -> "Cluster":
        self._thread.start()
        self.url = self._thread.url
        write_kubeconfig(self.kubeconfig, self.url)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._thread.stop()

    def client(self, namespace: str = "default") -> KubeClient:
        return KubeClient(self.url, self.kubeconfig, namespace)


class OperatorProcess:
    """The operator as a subprocess in its own process group, logging to ``log_path``."""

    def __init__(self, cluster: Cluster, args: list[str], log_path: pathlib.Path, env: Mapping[str, str] | None = None):
        self.cluster = cluster
        self.args = args
        self.log_path = log_path
        self.env = dict(env or {})
        self.process: subprocess.Popen | None = None

    def start(self) -> "OperatorProcess":
        env = dict(os.environ, KUBECONFIG=str(self.cluster.kubeconfig), PYTHONUNBUFFERED="1", **self.env)
        log = open(self.log_path, "ab")
        self.process = start_in_own_group(self.args, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        log.close()
        return self

    def stop(self, grace: float = 5.0) -> None:
        if self.process is not None:
            stop_process_group(self.process, grace=grace)

    def kill(self) -> None:
        """SIGKILL: the operator dies mid-work, with no chance to clean up."""
        if self.process is not None:
            stop_process_group(self.process, grace=0)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def __enter__(self) -> "OperatorProcess":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def operator_command(namespace: str, *extra: str) -> list[str]:
    """The project's operator entry point, watching one namespace, standalone, no HTTP ports."""
    return [sys.executable, "-m", "ddpjob_operator", "--namespace", namespace, "--standalone",
            "--liveness-port", "0", "--metrics-port", "0", *extra]


def kopf_command(namespace: str, module_path: pathlib.Path) -> list[str]:
    """``kopf run`` of an arbitrary handlers file (used to test the harness itself)."""
    return [sys.executable, "-m", "kopf", "run", "--standalone", "--namespace", namespace, str(module_path)]


@contextlib.contextmanager
def running_cluster(workdir: pathlib.Path) -> Iterator[Cluster]:
    with Cluster(workdir) as cluster:
        yield cluster


@pytest.fixture
def cluster(tmp_path: pathlib.Path) -> Iterator[Cluster]:
    with running_cluster(tmp_path) as running:
        yield running


@pytest.fixture
def k8s(cluster: Cluster) -> KubeClient:
    """A client bound to a fresh namespace of a fresh emulator."""
    return cluster.client(namespace=f"test-{uuid.uuid4().hex[:6]}")


@pytest.fixture
def operator(cluster: Cluster, k8s: KubeClient, tmp_path: pathlib.Path,
             request: pytest.FixtureRequest) -> Iterator[OperatorProcess]:
    """The real operator (``python -m ddpjob_operator``) watching ``k8s.namespace``;
    ``@pytest.mark.operator_args("--flag", "value")`` adds flags.

    Its log is printed (shown when the test fails), and an unexpected exception in it (a
    traceback) fails the test even when the cluster ended up as expected.
    """
    marker = request.node.get_closest_marker("operator_args")
    extra = marker.args if marker else ()
    process = OperatorProcess(cluster, operator_command(k8s.namespace, *extra), tmp_path / "operator.log")
    with process:
        yield process
    log = process.log()
    sys.stdout.write(f"\n--- operator log ({process.log_path}) ---\n{log[-20000:]}\n")
    assert "Traceback" not in log, f"the operator raised an unexpected exception:\n{log[-5000:]}"
