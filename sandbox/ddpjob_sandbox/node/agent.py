"""The node agent: the kubelet of one sandbox "node", running a namespace's pods as local processes.

It polls the pods of one namespace; for each new pod it starts the container (ddpjob_sandbox.node
.container) from the pod's local launch (.launch) and reports what a kubelet reports (.reporting):
Running, then the exit with its code and termination message. Deletion is graceful, as a
kubelet makes it: the finalizer held while the process runs keeps the pod until SIGTERM,
then SIGKILL after the grace period (capped by ``max_grace_seconds``, 5 s by default, with a
warning when a pod asks more: see capped_grace), has ended it.
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ddpjob_sandbox.client import KubeClient
from ddpjob_sandbox.node.container import PodProcess
from ddpjob_sandbox.node.launch import (
    NODE_ENV, POD_ENV, UnsupportedPodError, claim_dir, container_launch, pod_dir, volume_dirs,
)
from ddpjob_sandbox.node.reporting import PodReporter
from ddpjob_sandbox.pod_status import INSUFFICIENT_GPU, now_rfc3339, running_status, terminated_status, waiting_status
from ddpjob_sandbox.procs import holds_socket, kill_marked, listening_socket_inodes, marked_pids

log = logging.getLogger(__name__)

DEFAULT_GRACE_SECONDS = 30  # the API's default terminationGracePeriodSeconds
MAX_GRACE_SECONDS = 5.0  # the sandbox's cap on a pod's grace period, so a deletion in a test is quick


def capped_grace(pod_name: str, requested: float | None, cap: float) -> float:
    """The grace period the sandbox gives a pod: its terminationGracePeriodSeconds, at most ``cap``.

    A real kubelet gives the whole period; the cap keeps tests fast, and is logged when it cuts
    one short, because a trainer whose snapshot takes longer is then SIGKILLed mid-save here
    (and loses the steps since its last complete snapshot) where a cluster would let it finish.
    """
    grace = float(DEFAULT_GRACE_SECONDS if requested is None else requested)
    if grace > cap:
        log.warning("pod %s: terminationGracePeriodSeconds %g capped at the sandbox's %g s (max_grace_seconds)",
                    pod_name, grace, cap)
    return min(grace, cap)


class NodeAgent:
    """Runs the pods of one namespace as local process trees and reports their status.

    Args:
        client: an API client bound to the namespace to serve.
        root: the node's directory (claims, per-pod dirs and container logs).
        poll_seconds: how often pods and processes are looked at.
        max_grace_seconds: cap on a pod's terminationGracePeriodSeconds (tests stay fast; a
            capped pod is logged, see capped_grace).
        bind_nodes: give each started pod a Node of its own (``<pod>-<uid[:5]>``, Ready) and
            bind it there (spec.nodeName), so a test can take one pod's node down
            (:meth:`node_down`); off, pods have no node, as before.
        images: image name -> the Python environment standing for it (ddpjob_sandbox.images,
            node.launch.container_launch); other images run in this interpreter's environment.
    """

    def __init__(self, client: KubeClient, root: Path, *, poll_seconds: float = 0.1,
                 max_grace_seconds: float = MAX_GRACE_SECONDS, bind_nodes: bool = False,
                 images: Mapping[str, Path] | None = None):
        self.client = client
        self.reporter = PodReporter(client)
        self.root = Path(root)
        self.poll_seconds = poll_seconds
        self.max_grace_seconds = max_grace_seconds
        self.images = dict(images or {})
        self.bind_nodes = bind_nodes  # opt-in: each started pod gets a Node object of its own (spec.nodeName)
        self.unschedulable: dict[str, str] = {}  # pod name -> scheduler message while the test holds it
        self.dead: set[str] = set()  # uids of pods whose node went down: their kubelet answers no more
        self.node_id = uuid.uuid4().hex[:12]
        self.pods: dict[str, PodProcess] = {}  # uid -> container, finished ones kept for tests
        self.rejected: dict[str, str] = {}  # uid -> why the pod could not start
        self.errors: list[str] = []  # exceptions the loop survived (API down, a write racing a deletion)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sandbox-node-agent", daemon=True)

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> "NodeAgent":
        self.root.mkdir(parents=True, exist_ok=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stops the loop and kills every process it started (always, whatever state they are in)."""
        self._stop.set()
        self._thread.join(timeout=30)
        with self._lock:
            containers = list(self.pods.values())
        for container in containers:
            container.kill()
        for container in containers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                container.process.wait(timeout=10)
        # Signals land asynchronously: return only once nothing marked is left (or say so).
        deadline = time.monotonic() + 10
        while kill_marked(NODE_ENV, self.node_id) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = marked_pids(self.node_id, key=NODE_ENV)
        if left:
            raise RuntimeError(f"sandbox node {self.node_id}: processes {left} survived SIGKILL for 10 s")

    def __enter__(self) -> "NodeAgent":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ----------------------------------------------------------------- for tests

    def current(self, name: str) -> PodProcess | None:
        """The newest container started for pod ``name``."""
        with self._lock:
            matches = [c for c in self.pods.values() if c.name == name]
        return matches[-1] if matches else None

    def wait_for_container(self, name: str, timeout: float = 30, *, other_than: str | None = None) -> PodProcess:
        """Waits until a container of pod ``name`` (with a uid other than ``other_than``) was started."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            container = self.current(name)
            if container is not None and container.uid != other_than:
                return container
            time.sleep(0.05)
        raise AssertionError(f"no container of pod {name} (other than uid {other_than}) started within {timeout} s; "
                             f"rejected pods: {self.rejected}; loop errors: {self.errors[-3:]}")

    def kill(self, name: str, sig: int = signal.SIGKILL) -> PodProcess:
        """Kills every process of pod ``name``'s running container (a node or OOM kill); returns it."""
        container = self.current(name)
        if container is None or container.process.poll() is not None:
            raise AssertionError(f"pod {name} has no running container to kill: {container}")
        container.kill(sig)
        return container

    def hold_unscheduled(self, name: str, message: str = INSUFFICIENT_GPU) -> None:
        """Plays a scheduler without capacity: pod ``name`` (and any pod of that name created
        later) stays Pending with PodScheduled False, reason Unschedulable and ``message``."""
        self.unschedulable[name] = message

    def release(self, name: str) -> None:
        """Capacity arrived: pod ``name`` is scheduled and started on the next poll."""
        self.unschedulable.pop(name, None)

    def node_down(self, name: str) -> PodProcess:
        """The node of pod ``name`` dies: its Node turns NotReady, its processes are killed, and
        its kubelet answers no more (no status, no deletion handling: the pod would stay
        Terminating). The agent's finalizer is dropped, as a dead kubelet holds nothing; with
        the emulator's ``graceful_pod_deletion`` a deletion then waits for a force delete.

        Raises:
            AssertionError: the agent was made without ``bind_nodes`` or the pod runs nothing.
        """
        if not self.bind_nodes:
            raise AssertionError("node_down needs NodeAgent(bind_nodes=True): without it pods have no node")
        container = self.kill(name)
        with self._lock:
            self.dead.add(container.uid)
        pod = self.client.get("pods", name)
        node = pod["spec"]["nodeName"]
        self.reporter.set_node_ready(node, False)
        self.reporter.release(pod)
        return container

    def node_of(self, name: str) -> str:
        """spec.nodeName of pod ``name`` ('' when unbound)."""
        return (self.client.get("pods", name)["spec"].get("nodeName") or "")

    def pod_listening_on(self, port: int) -> str | None:
        """The pod whose process listens on TCP ``port`` (the c10d store host), if any."""
        inodes = listening_socket_inodes(port)
        if not inodes:
            return None
        with self._lock:
            running = [c for c in self.pods.values() if c.exit_code is None]
        for container in running:
            if any(holds_socket(pid, inodes) for pid in container.pids()):
                return container.name
        return None

    def claim_dir(self, claim: str) -> Path:
        return claim_dir(self.root, self.client.namespace, claim)

    def logs(self, chars: int = 2500) -> str:
        with self._lock:
            containers = list(self.pods.values())
        return "\n".join(f"--- pod {c.name} uid {c.uid[:8]} (exit {c.exit_code}) ---\n{c.log(chars)}"
                         for c in containers)

    # ----------------------------------------------------------------- the loop

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._tick()
            except Exception as e:  # noqa: BLE001  a dead loop would leave tests waiting blind:
                self.errors.append(repr(e))  # keep serving; the fixture prints what went wrong
            self._stop.wait(self.poll_seconds)

    def _tick(self) -> None:
        observed = {p["metadata"]["uid"]: p for p in self.client.list("pods")}
        for uid, pod in observed.items():
            if uid not in self.pods and uid not in self.rejected and not pod["metadata"].get("deletionTimestamp"):
                if pod["metadata"]["name"] in self.unschedulable:
                    self.reporter.report_unschedulable(pod, self.unschedulable[pod["metadata"]["name"]])
                elif (pod.get("status") or {}).get("phase") in (None, "Pending"):
                    self._start(pod)
        with self._lock:
            containers = list(self.pods.values())
        for container in containers:
            self._follow(container, observed.get(container.uid))

    def _start(self, pod: dict) -> None:
        meta = pod["metadata"]
        container_name = pod["spec"]["containers"][0]["name"]
        try:
            launch = container_launch(pod, self.root, self.reporter.service_names(), os.environ, self.images)
        except UnsupportedPodError as e:
            self.rejected[meta["uid"]] = str(e)
            self.reporter.patch_status(meta["name"], waiting_status(container_name, str(e)))
            return
        node = self.reporter.create_node(f"{meta['name']}-{meta['uid'][:5]}") if self.bind_nodes else None
        if not self.reporter.hold(meta, node):
            return  # deleted before it could start
        for directory in (launch.cwd, *volume_dirs(pod, self.root).values()):
            directory.mkdir(parents=True, exist_ok=True)
        launch.termination_log.touch()  # the kubelet creates it before the container starts
        log_path = pod_dir(self.root, meta) / "container.log"
        env = {**launch.env, POD_ENV: meta["uid"], NODE_ENV: self.node_id}
        grace = capped_grace(meta["name"], pod["spec"].get("terminationGracePeriodSeconds"), self.max_grace_seconds)
        with open(log_path, "ab") as log:
            process = subprocess.Popen(launch.argv, env=env, cwd=launch.cwd, stdout=log, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, start_new_session=True)
        spec = pod["spec"]["containers"][0]
        container = PodProcess(meta["namespace"], meta["name"], meta["uid"], process, log_path, now_rfc3339(), grace,
                               termination_log=launch.termination_log,
                               fallback_to_logs=spec.get("terminationMessagePolicy") == "FallbackToLogsOnError")
        with self._lock:
            self.pods[meta["uid"]] = container
        self.reporter.patch_status(meta["name"], running_status(container_name, container.started_at), uid=meta["uid"])

    def _follow(self, container: PodProcess, pod: dict | None) -> None:
        """Moves one container on: report its exit, stop it when its pod is deleted or gone."""
        if container.uid in self.dead:
            container.poll()  # reaped, but a dead kubelet reports nothing and stops nothing
            return
        deleting = pod is None or bool(pod["metadata"].get("deletionTimestamp"))
        if deleting:
            container.terminate()
        if container.poll() is None:
            return
        if not container.reported and pod is not None:
            name = pod["spec"]["containers"][0]["name"]
            self.reporter.patch_status(container.name, terminated_status(
                name, container.started_at, container.finished_at, container.exit_code,
                container.termination_message()), uid=container.uid)
            container.reported = True
        if deleting and pod is not None:
            self.reporter.release(pod)


@contextlib.contextmanager
def running_node_agent(client: KubeClient, root: Path, **options: Any) -> Iterator[NodeAgent]:
    """A started node agent, always stopped with all its processes."""
    agent = NodeAgent(client, root, **options)
    with agent:
        yield agent
