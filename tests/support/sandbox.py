"""A one-machine "node" for end-to-end tests: runs the emulator's pods as local processes.

The API emulator stores pods but runs none. :class:`NodeAgent` plays the kubelet of a single
node: it polls the pods of one namespace and, for each new pod, starts its container's
command as a local process with the pod's environment, then reports back through the API
what a kubelet reports (phase, podIP, the container's running/terminated state with the exit
code). With it the real operator, real torchrun and the real trainer run a DDPJob end to end
on loopback. It serves tests and benchmarks, not users.

What it maps, and why:

* volumes: a ``persistentVolumeClaim`` becomes one directory per claim shared by every pod
  (the snapshot volume must be shared across nodes and survive pod replacement); an
  ``emptyDir`` one directory per pod. Env values and args under a container's mountPaths
  are rewritten to those directories (there is no mount namespace).
* DNS: ``*.svc``, ``*.svc.cluster.local`` and ``<pod>.<service>[.<ns>]`` names become
  127.0.0.1, so the c10d endpoint ``mlp-node-0.mlp.<ns>.svc.cluster.local:PORT`` resolves.
  On loopback every c10d agent would find its own address in the endpoint; the rendered
  ``is_host`` in PET_RDZV_CONF (launch.hosts_c10d_store) says who hosts the store: nobody
  with the store pod (the default), node 0 with ``rdzvStore: node``.
  :meth:`NodeAgent.pod_listening_on` tells which pod really listens.
* the image: ``torchrun``/``python`` resolve to this interpreter's virtualenv; the process
  inherits this machine's environment (PATH, HOME) minus torchrun and ddpjob variables, then
  gets the pod's env on top, like an image's env under a container's.
* the container: a new session (setsid) whose every process, torchrun's workers included
  (they start sessions of their own), carries a marker in its environment. The container
  "dies" as a whole: when its main process exits, or is killed, whatever is left is killed,
  and SIGKILL reads as exit code 137 (128 + 9) with reason ``Error``, as from a runtime.
* termination messages: the file at ``terminationMessagePath`` is a per-pod file (env values
  naming the path point there); on exit its content, or with ``FallbackToLogsOnError`` after
  a failure the log's tail, becomes ``terminated.message``, as a kubelet reports it.
* deletion: a finalizer held while the process runs makes deletion graceful, as a kubelet
  does: DELETE marks the pod, the agent sends SIGTERM to the main process, SIGKILLs the rest
  after the grace period (capped by ``max_grace_seconds`` to keep tests fast), reports the
  exit and only then lets the pod go. The pod name stays taken until its processes are gone.

Opt-in, for capacity and node faults: :meth:`NodeAgent.hold_unscheduled` keeps a pod Pending
with the scheduler's PodScheduled False / Unschedulable until :meth:`NodeAgent.release`;
``bind_nodes=True`` gives each pod a Node of its own and :meth:`NodeAgent.node_down` kills that
machine (Node NotReady, processes gone, the kubelet silent). Conditions others set on a pod
(DisruptionTarget) survive the agent's status writes, as they do a kubelet's.

Only ``restartPolicy: Never`` (what the operator renders), one container, literal env
values and claim/emptyDir volumes are supported; anything else leaves the pod Pending with a
``CreateContainerConfigError`` waiting reason naming what is unsupported.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from ddpjob_sandbox.client import ApiError, KubeClient
from ddpjob_sandbox.procs import free_port
from ddpjob_sandbox.metrics import read_events

LOOPBACK = "127.0.0.1"
FINALIZER = "sandbox.ddpjob.io/node-agent"  # held while the pod's processes run
NODE_ENV = "SANDBOX_NODE"  # marks every process this agent started (teardown safety net)
POD_ENV = "SANDBOX_POD_UID"  # marks every process of one pod (the container's boundary)
DEFAULT_GRACE_SECONDS = 30  # the API's default terminationGracePeriodSeconds
DEFAULT_TERMINATION_PATH = "/dev/termination-log"  # the API's default terminationMessagePath
MESSAGE_BYTES = 4096  # the kubelet keeps at most this much of a termination message
FALLBACK_LOG_LINES, FALLBACK_LOG_BYTES = 80, 2048  # FallbackToLogsOnError: the log's tail, capped
# Variables of this machine that would fight the pod's own: torchrun flags, ddpjob settings.
DROPPED_ENV_PREFIXES = ("PET_", "DDPJOB_", "TORCHELASTIC_", "KUBECONFIG", POD_ENV, NODE_ENV)
VENV_COMMANDS = ("torchrun", "python", "python3")  # found next to sys.executable, not on PATH
INSUFFICIENT_GPU = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."  # kube-scheduler's words

# A DNS name that only cluster DNS resolves: anything under .svc / .svc.cluster.local.
_SVC_NAME = re.compile(r"(?<![\w.-])[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
                       r"\.svc(\.cluster\.local)?(?![\w.-])")


class UnsupportedPodError(ValueError):
    """The pod uses something this one-machine node cannot provide."""


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# --------------------------------------------------------------------- pure mapping of a pod


@dataclasses.dataclass(frozen=True)
class ContainerLaunch:
    """What the node runs for a pod: argv, environment, working directory."""

    argv: list[str]
    env: dict[str, str]
    cwd: Path
    termination_log: Path | None = None  # the local file behind terminationMessagePath


def volume_dirs(pod: Mapping[str, Any], root: Path) -> dict[str, Path]:
    """Volume name -> local directory: shared per claim, private per pod for emptyDir.

    Raises:
        UnsupportedPodError: a volume of another kind (secret, configMap, hostPath...).
    """
    meta = pod["metadata"]
    dirs = {}
    for volume in pod["spec"].get("volumes") or []:
        name = volume["name"]
        if "persistentVolumeClaim" in volume:
            claim = volume["persistentVolumeClaim"]["claimName"]
            dirs[name] = claim_dir(root, meta["namespace"], claim)
        elif "emptyDir" in volume:
            dirs[name] = pod_dir(root, meta) / "volumes" / name
        else:
            kind = next((k for k in volume if k != "name"), "?")
            raise UnsupportedPodError(f"volume {name!r} is a {kind}; the sandbox node supports "
                                      "persistentVolumeClaim and emptyDir only")
    return dirs


def claim_dir(root: Path, namespace: str, claim: str) -> Path:
    """The directory that stands for PersistentVolumeClaim ``claim`` (ReadWriteMany)."""
    return root / "claims" / namespace / claim


def pod_dir(root: Path, meta: Mapping[str, Any]) -> Path:
    """A pod's private directory (like /var/lib/kubelet/pods/<uid>)."""
    return root / "pods" / f"{meta['namespace']}_{meta['name']}_{meta['uid']}"


def mounts(container: Mapping[str, Any], dirs: Mapping[str, Path]) -> list[tuple[str, Path]]:
    """(mountPath, local dir) of each volumeMount, longest path first (the innermost mount wins)."""
    pairs = []
    for mount in container.get("volumeMounts") or []:
        local = dirs[mount["name"]]
        sub = mount.get("subPath")
        pairs.append((mount["mountPath"].rstrip("/") or "/", local / sub if sub else local))
    return sorted(pairs, key=lambda pair: -len(pair[0]))


def localize(value: str, mount_pairs: list[tuple[str, Path]]) -> str:
    """``value`` with a leading mountPath (the path itself or below it) replaced by its directory."""
    for path, local in mount_pairs:
        if value == path:
            return str(local)
        if value.startswith(path + "/"):
            return str(local / value[len(path) + 1:])
    return value


def map_hosts(value: str, namespace: str, services: list[str]) -> str:
    """Cluster DNS names inside ``value`` replaced by 127.0.0.1 (every pod runs on loopback)."""
    value = _SVC_NAME.sub(LOOPBACK, value)
    if services:
        names = "|".join(re.escape(s) for s in services)
        pod_in_service = rf"(?<![\w.-])[a-z0-9]([-a-z0-9]*[a-z0-9])?\.({names})(\.{re.escape(namespace)})?(?![\w.-])"
        value = re.sub(pod_in_service, LOOPBACK, value)
    return value


def resolve_command(name: str) -> str:
    """The executable for a container's command[0]: the virtualenv's torchrun/python, else PATH."""
    if "/" not in name and name in VENV_COMMANDS:
        candidate = Path(sys.executable).parent / name
        if candidate.exists():
            return str(candidate)
    found = shutil.which(name) if "/" not in name else name
    if not found:
        raise UnsupportedPodError(f'command "{name}" is not found next to {sys.executable} or on PATH')
    return found


def base_env(environ: Mapping[str, str]) -> dict[str, str]:
    """This machine's environment as the "image" env: without torchrun, ddpjob and sandbox variables."""
    return {k: v for k, v in environ.items() if not k.startswith(DROPPED_ENV_PREFIXES)}


def container_launch(pod: Mapping[str, Any], root: Path, services: list[str],
                     environ: Mapping[str, str]) -> ContainerLaunch:
    """The local launch of a pod's (only) container.

    Args:
        pod: the Pod object.
        root: the node's directory (volumes, logs, working directories).
        services: Service names in the pod's namespace (for ``<pod>.<service>`` names).
        environ: the environment the "image" provides (see base_env).

    Raises:
        UnsupportedPodError: more than one container, a valueFrom env entry, an unsupported
            volume or a command that is not found.
    """
    spec, meta = pod["spec"], pod["metadata"]
    containers = spec.get("containers") or []
    if len(containers) != 1:
        raise UnsupportedPodError(f"pod has {len(containers)} containers; the sandbox node runs exactly one")
    container = containers[0]
    termination_log = pod_dir(root, meta) / "termination-log"
    # The kubelet bind-mounts one file at terminationMessagePath; here paths naming it move.
    pairs = [(container.get("terminationMessagePath", DEFAULT_TERMINATION_PATH), termination_log),
             *mounts(container, volume_dirs(pod, root))]

    def local(value: str) -> str:
        return map_hosts(localize(value, pairs), meta["namespace"], services)

    env = base_env(environ)
    env["HOSTNAME"] = spec.get("hostname") or meta["name"]
    for entry in container.get("env") or []:
        if "valueFrom" in entry:
            raise UnsupportedPodError(f"env {entry['name']} uses valueFrom; the sandbox node takes literal values only")
        env[entry["name"]] = local(entry.get("value") or "")
    command = list(container.get("command") or [])
    if not command:
        raise UnsupportedPodError("container has no command; the sandbox node has no image entrypoint to fall back on")
    argv = [resolve_command(command[0]), *map(local, command[1:]), *map(local, container.get("args") or [])]
    cwd = Path(localize(container["workingDir"], pairs)) if container.get("workingDir") else pod_dir(root, meta) / "cwd"
    return ContainerLaunch(argv, env, cwd, termination_log)


def exit_code_of(returncode: int) -> int:
    """A container runtime's exit code: killed by signal N reads as 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


# --------------------------------------------------------------------- processes


def marked_pids(key: str, value: str) -> list[int]:
    """Live (non-zombie) processes whose environment holds ``key=value``."""
    needle = f"{key}={value}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if needle in environ and state != "Z":
            pids.append(int(entry))
    return pids


def kill_marked(key: str, value: str, sig: int = signal.SIGKILL) -> list[int]:
    """Signals every marked process and the group each leads (torchrun workers lead their own)."""
    pids = marked_pids(key, value)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    return pids


def listening_socket_inodes(port: int) -> set[str]:
    """Socket inodes listening on TCP ``port`` (IPv4 or IPv6), from /proc/net."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:  # 0A = LISTEN
                    inodes.add(inode)
    return inodes


def holds_socket(pid: int, inodes: set[str]) -> bool:
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    return True
    return False


@dataclasses.dataclass
class PodProcess:
    """A running (or finished) container: one pod's process tree."""

    namespace: str
    name: str
    uid: str
    process: subprocess.Popen
    log_path: Path
    started_at: str
    grace_seconds: float
    exit_code: int | None = None
    finished_at: str | None = None
    term_sent_at: float | None = None  # monotonic time of the SIGTERM of a graceful deletion
    reported: bool = False  # the terminated status was written
    termination_log: Path | None = None  # the file the kubelet would copy into terminated.message
    fallback_to_logs: bool = False  # terminationMessagePolicy FallbackToLogsOnError

    def pids(self) -> list[int]:
        return marked_pids(POD_ENV, self.uid)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signals the whole container: the main process group, then every marked process."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, sig)
        kill_marked(POD_ENV, self.uid, sig)

    def poll(self) -> int | None:
        """The exit code once the main process exited; then nothing of the container is left alive."""
        if self.exit_code is None and self.process.poll() is not None:
            kill_marked(POD_ENV, self.uid)  # the container goes with its main process
            self.exit_code = exit_code_of(self.process.returncode)
            self.finished_at = now_rfc3339()
        return self.exit_code

    def terminate(self) -> None:
        """Graceful stop step: SIGTERM the main process once, SIGKILL all after the grace period."""
        if self.poll() is not None:
            return
        if self.term_sent_at is None:
            self.term_sent_at = time.monotonic()
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGTERM)
        elif time.monotonic() - self.term_sent_at >= self.grace_seconds:
            self.kill()

    def termination_message(self) -> str | None:
        """What a kubelet puts in ``terminated.message``: the file, else (by policy, after a
        failure) the last lines of the log."""
        message = ""
        if self.termination_log is not None:
            with contextlib.suppress(OSError):
                message = self.termination_log.read_bytes()[:MESSAGE_BYTES].decode(errors="replace").strip()
        if not message and self.fallback_to_logs and self.exit_code:
            tail = "\n".join(self.log(chars=64 * 1024).splitlines()[-FALLBACK_LOG_LINES:])
            message = tail.encode()[-FALLBACK_LOG_BYTES:].decode(errors="replace").strip()
        return message or None

    def log(self, chars: int = 4000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-chars:]
        return ""


# --------------------------------------------------------------------- status bodies


def running_status(container: str, started_at: str) -> dict:
    """What a kubelet reports once the container started (ready: no probes are rendered)."""
    conditions = [{"type": t, "status": "True", "lastTransitionTime": started_at}
                  for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")]
    return {"status": {
        "phase": "Running", "hostIP": LOOPBACK, "podIP": LOOPBACK, "podIPs": [{"ip": LOOPBACK}],
        "startTime": started_at, "conditions": conditions,
        "containerStatuses": [{"name": container, "ready": True, "started": True, "restartCount": 0,
                               "image": "sandbox", "imageID": "", "state": {"running": {"startedAt": started_at}}}]}}


def terminated_status(container: str, started_at: str, finished_at: str, exit_code: int,
                      message: str | None = None) -> dict:
    """What a kubelet reports when the container exited (restartPolicy Never: the phase follows)."""
    reason = "Completed" if exit_code == 0 else "Error"
    terminated = {"exitCode": exit_code, "reason": reason, "startedAt": started_at, "finishedAt": finished_at,
                  **({"message": message} if message else {})}
    conditions = [{"type": t, "status": "False", "lastTransitionTime": finished_at, "reason": "PodCompleted"}
                  for t in ("ContainersReady", "Ready")]
    return {"status": {
        "phase": "Succeeded" if exit_code == 0 else "Failed", "conditions": conditions,
        "containerStatuses": [{"name": container, "ready": False, "started": False, "restartCount": 0,
                               "image": "sandbox", "imageID": "", "state": {"terminated": terminated}}]}}


def unschedulable_status(message: str) -> dict:
    """What kube-scheduler reports for a pod it cannot place: Pending, PodScheduled False."""
    return {"status": {"phase": "Pending", "conditions": [{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message,
        "lastTransitionTime": now_rfc3339()}]}}


def node_ready_condition(ready: bool) -> dict:
    """A Node's Ready condition as the node controller sets it."""
    return {"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": now_rfc3339(),
            "reason": "KubeletReady" if ready else "NodeStatusUnknown",
            "message": "kubelet is posting ready status" if ready else "Kubelet stopped posting node status."}


def keep_foreign_conditions(body: dict, pod: Mapping[str, Any]) -> dict:
    """``body`` with the pod's conditions of types it does not set kept, as a kubelet keeps
    those others own (DisruptionTarget from the scheduler or the eviction API); a merge
    patch would otherwise replace the whole list."""
    new = (body.get("status") or {}).get("conditions")
    if new is None:
        return body
    types = {c["type"] for c in new}
    kept = [c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") not in types]
    return {**body, "status": {**body["status"], "conditions": [*new, *kept]}}


def waiting_status(container: str, message: str) -> dict:
    """A container that cannot be created (stays Pending), as a kubelet reports a config error."""
    return {"status": {"phase": "Pending", "containerStatuses": [{
        "name": container, "ready": False, "started": False, "restartCount": 0, "image": "sandbox",
        "imageID": "", "state": {"waiting": {"reason": "CreateContainerConfigError", "message": message}}}]}}


# --------------------------------------------------------------------- the node agent


class NodeAgent:
    """Runs the pods of one namespace as local process trees and reports their status.

    Args:
        client: an API client bound to the namespace to serve.
        root: the node's directory (claims, per-pod dirs and container logs).
        poll_seconds: how often pods and processes are looked at.
        max_grace_seconds: cap on a pod's terminationGracePeriodSeconds (tests stay fast).
        bind_nodes: give each started pod a Node of its own (``<pod>-<uid[:5]>``, Ready) and
            bind it there (spec.nodeName), so a test can take one pod's node down
            (:meth:`node_down`); off, pods have no node, as before.
    """

    def __init__(self, client: KubeClient, root: Path, *, poll_seconds: float = 0.1,
                 max_grace_seconds: float = 5.0, bind_nodes: bool = False):
        self.client = client
        self.root = Path(root)
        self.poll_seconds = poll_seconds
        self.max_grace_seconds = max_grace_seconds
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
        left = marked_pids(NODE_ENV, self.node_id)
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
        self.client.patch("nodes", node, {"status": {"conditions": [node_ready_condition(False)]}},
                          subresource="status")
        self._release(pod)
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
                    self._report_unschedulable(pod)
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
            launch = container_launch(pod, self.root, self._service_names(), os.environ)
        except UnsupportedPodError as e:
            self.rejected[meta["uid"]] = str(e)
            self._patch_status(meta["name"], waiting_status(container_name, str(e)))
            return
        if not self._hold(meta):
            return  # deleted before it could start
        for directory in (launch.cwd, *volume_dirs(pod, self.root).values()):
            directory.mkdir(parents=True, exist_ok=True)
        launch.termination_log.touch()  # the kubelet creates it before the container starts
        log_path = pod_dir(self.root, meta) / "container.log"
        env = {**launch.env, POD_ENV: meta["uid"], NODE_ENV: self.node_id}
        grace = min(float(pod["spec"].get("terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS)),
                    self.max_grace_seconds)
        with open(log_path, "ab") as log:
            process = subprocess.Popen(launch.argv, env=env, cwd=launch.cwd, stdout=log, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, start_new_session=True)
        spec = pod["spec"]["containers"][0]
        container = PodProcess(meta["namespace"], meta["name"], meta["uid"], process, log_path, now_rfc3339(), grace,
                               termination_log=launch.termination_log,
                               fallback_to_logs=spec.get("terminationMessagePolicy") == "FallbackToLogsOnError")
        with self._lock:
            self.pods[meta["uid"]] = container
        self._patch_status(meta["name"], running_status(container_name, container.started_at), uid=meta["uid"])

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
            self._patch_status(container.name, terminated_status(
                name, container.started_at, container.finished_at, container.exit_code,
                container.termination_message()), uid=container.uid)
            container.reported = True
        if deleting and pod is not None:
            self._release(pod)

    def _report_unschedulable(self, pod: dict) -> None:
        """PodScheduled False with the scheduler's reason and message, written once per pod."""
        message = self.unschedulable[pod["metadata"]["name"]]
        scheduled = next((c for c in (pod.get("status") or {}).get("conditions") or []
                          if c.get("type") == "PodScheduled"), {})
        if (scheduled.get("status"), scheduled.get("message")) != ("False", message):
            self._patch_status(pod["metadata"]["name"], unschedulable_status(message), uid=pod["metadata"]["uid"])

    def _hold(self, meta: dict) -> bool:
        """Adds the finalizer so that a deletion waits for the processes (and, with bind_nodes,
        binds the pod to a Node of its own); False when the pod is gone."""
        finalizers = [*(meta.get("finalizers") or []), FINALIZER]
        patch: dict[str, Any] = {"metadata": {"finalizers": finalizers, "resourceVersion": meta["resourceVersion"]}}
        if self.bind_nodes:
            patch["spec"] = {"nodeName": self._create_node(f"{meta['name']}-{meta['uid'][:5]}")}
        try:
            self.client.patch("pods", meta["name"], patch)
        except ApiError as e:
            if e.status in (404, 409):  # deleted or changed meanwhile: look again next tick
                return False
            raise
        return True

    def _create_node(self, name: str) -> str:
        """A Ready Node object (cluster-scoped) standing for one pod's machine."""
        with contextlib.suppress(ApiError):
            self.client.create("nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
        self.client.patch("nodes", name, {"status": {"conditions": [node_ready_condition(True)]}},
                          subresource="status")
        return name

    def _release(self, pod: dict) -> None:
        """Removes the finalizer: the API server then removes the deleted pod."""
        meta = pod["metadata"]
        rest = [f for f in meta.get("finalizers") or [] if f != FINALIZER]
        with contextlib.suppress(ApiError):
            self.client.patch("pods", meta["name"], {"metadata": {"finalizers": rest or None}})

    def _patch_status(self, name: str, body: dict, uid: str | None = None) -> None:
        """Writes a pod's status unless the pod is gone or was replaced by another of that name."""
        if uid is not None:
            current = self.client.find("pods", name)
            if current is None or current["metadata"]["uid"] != uid:
                return
            body = keep_foreign_conditions(body, current)
        with contextlib.suppress(ApiError):
            self.client.patch("pods", name, body, subresource="status")

    def _service_names(self) -> list[str]:
        with contextlib.suppress(ApiError):
            return [s["metadata"]["name"] for s in self.client.list("services")]
        return []


@contextlib.contextmanager
def running_node_agent(client: KubeClient, root: Path, **options: Any) -> Iterator[NodeAgent]:
    """A started node agent, always stopped with all its processes."""
    agent = NodeAgent(client, root, **options)
    with agent:
        yield agent


@pytest.fixture
def node_agent(k8s: KubeClient, tmp_path: Path) -> Iterator[NodeAgent]:
    """A node agent running the pods of ``k8s.namespace``; its container logs are printed after the test."""
    with running_node_agent(k8s, tmp_path / "node") as agent:
        yield agent
        sys.stdout.write(f"\n--- sandbox node containers ---\n{agent.logs()}\nnode agent API errors: {agent.errors}\n")


# --------------------------------------------------------------------- the example job, test-speed


REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "manifests" / "examples"

# torchrun rendezvous timeouts that make an elastic event cost ~7-15 s instead of ~45 s (the
# example's 30 s last call is paid by every restart); joinSeconds bounds a hang.
FAST_RDZV_TIMEOUTS = {"joinSeconds": 60, "lastCallSeconds": 3, "keepAliveIntervalSeconds": 2,
                      "keepAliveMaxAttempts": 3}


def example_job(file: str = "ddpjob-c10d.yaml", *, args: list[str], rdzv_port: int | None = None,
                backoff_seconds: int = 1) -> dict:
    """An example manifest with test-speed overrides, each of which a test must say it uses:

    ``args`` replace the trainer's (fewer samples, --step-sleep, --snapshot-every-steps),
    one worker per node (``auto`` would start one per CPU on this 2-core machine), a free
    rendezvous port (tests run side by side on one loopback), FAST_RDZV_TIMEOUTS, and a
    ``backoff_seconds`` first replacement delay (the example waits 10 s).
    """
    body = yaml.safe_load((EXAMPLES / file).read_text())
    spec = body["spec"]
    spec["args"] = list(args)
    elastic = spec["elasticPolicy"]
    elastic["nProcPerNode"] = 1
    elastic["rdzvTimeouts"] = dict(FAST_RDZV_TIMEOUTS)
    if rdzv_port is not None:
        elastic["rdzvPort"] = rdzv_port
    spec["failurePolicy"].update(backoffSeconds=backoff_seconds, maxBackoffSeconds=max(2, backoff_seconds))
    return body


def trainer_args(*, epochs: int, samples: int, step_sleep: float, snapshot_every_steps: int,
                 batch_size: int = 32, extra: tuple[str, ...] = ()) -> list[str]:
    """The example trainer's arguments for a short job (no validation, no progress bar)."""
    return ["--epochs", str(epochs), "--samples", str(samples), "--batch-size", str(batch_size),
            "--snapshot-every-epochs", "1", "--snapshot-every-steps", str(snapshot_every_steps),
            "--step-sleep", str(step_sleep), "--val-samples", "0", "--no-progress-bar", *extra]


def kubectl_apply(k8s: KubeClient, body: Mapping[str, Any], workdir: Path) -> Path:
    """``kubectl apply -f`` of ``body`` written to a file, as a user applies a manifest."""
    path = Path(workdir) / f"{body['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(dict(body), sort_keys=False))
    k8s.kubectl("apply", "--validate=false", "-f", str(path))
    return path


class JobProgress:
    """Follows one sandboxed job through its metrics file, failing fast when the job fails.

    Each :meth:`wait` returns the first event after the previous match that satisfies the
    predicate, so a scenario reads top to bottom (as ``tests.support.torchrun.MetricsWatcher``).
    """

    def __init__(self, k8s: KubeClient, agent: NodeAgent, job: str, metrics_path: Path):
        self.k8s = k8s
        self.agent = agent
        self.job = job
        self.metrics_path = Path(metrics_path)
        self.cursor = 0

    def events(self) -> list[dict]:
        return read_events(self.metrics_path)

    def status(self) -> dict:
        return (self.k8s.find("ddpjobs", self.job) or {}).get("status") or {}

    def wait(self, predicate: Callable[[dict], bool], timeout: float, what: str) -> dict:
        deadline = time.monotonic() + timeout
        next_status_check = 0.0
        while True:
            events = self.events()
            for index in range(self.cursor, len(events)):
                if predicate(events[index]):
                    self.cursor = index + 1
                    return events[index]
            failed = False
            if time.monotonic() >= next_status_check:
                failed = self.status().get("phase") == "Failed"
                next_status_check = time.monotonic() + 1.0
            if failed or time.monotonic() > deadline:
                self.fail(f"waiting for {what}: " + ("the job failed" if failed else f"timed out after {timeout} s"))
            time.sleep(0.1)

    def wait_phase(self, phase: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = self.status()
            if status.get("phase") == phase:
                return status
            if status.get("phase") in ("Succeeded", "Failed"):
                break
            time.sleep(0.2)
        self.fail(f"waiting for phase {phase} within {timeout} s")

    def fail(self, message: str) -> None:
        tail = "\n".join(json.dumps(e) for e in self.events()[-8:])
        raise AssertionError(f"{message}\njob status: {json.dumps(self.status(), indent=1)}\n"
                             f"last metrics:\n{tail}\ncontainers:\n{self.agent.logs()}")


def start_job(k8s: KubeClient, agent: NodeAgent, workdir: Path, *, args: list[str], rdzv_store: str = "node",
              edit: Callable[[dict], None] | None = None) -> tuple[JobProgress, dict]:
    """Applies the test-speed c10d example (see example_job) and follows it.

    ``rdzv_store`` is always set (the default may change); ``edit`` changes the spec further.
    Returns the progress follower and the applied body.
    """
    body = example_job(args=args, rdzv_port=free_port())
    body["spec"]["elasticPolicy"]["rdzvStore"] = rdzv_store
    if edit is not None:
        edit(body["spec"])
    kubectl_apply(k8s, body, workdir)
    claim = body["spec"]["snapshot"]["volume"]["persistentVolumeClaim"]["claimName"]
    return JobProgress(k8s, agent, body["metadata"]["name"], agent.claim_dir(claim) / "metrics.jsonl"), body
