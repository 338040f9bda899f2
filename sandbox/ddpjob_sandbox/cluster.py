"""The API emulator served on loopback, with the DDPJob CRD registered and a kubeconfig.

``running_cluster()`` serves a :class:`KubeEmulator` on a free loopback port from a background
thread (its own event loop), registers the DDPJob CRD and writes a kubeconfig that kubectl,
kopf and the operator log in with, the same way they log in to a real cluster.
"""
from __future__ import annotations

import asyncio
import contextlib
import pathlib
import threading
from collections.abc import Iterator
from typing import Any

import kmock
import yaml

from ddpjob_sandbox.client import KubeClient
from ddpjob_sandbox.emulator import KubeEmulator

REPO = pathlib.Path(__file__).resolve().parents[2]
CRD_PATH = REPO / "manifests" / "crds" / "ddpjobs.ddpjob.io.yaml"


def load_crd() -> dict:
    """The generated CRD manifest (as ``kubectl apply`` would install it), else the generator's output."""
    if CRD_PATH.exists():
        return yaml.safe_load(CRD_PATH.read_text())
    from ddpjob_operator.api.crd import build_crd

    return build_crd()


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


@contextlib.contextmanager
def running_cluster(workdir: pathlib.Path) -> Iterator[Cluster]:
    with Cluster(workdir) as cluster:
        yield cluster
