"""The node agent: the kubelet of one sandbox "node", running its pods as local processes.

It polls its pods; for each new pod it starts the container (ddpjob_sandbox.node.container)
from the pod's local launch (.launch, .network, .projection) and reports what a kubelet
reports (.reporting): Running with the pod's address, then the exit with its code and
termination message. Deletion is graceful, as a kubelet makes it: SIGTERM, then SIGKILL after
the grace period (capped by ``max_grace_seconds``, 5 s by default, with a warning when a pod
asks more: see capped_grace), and only then does the pod go.

It is the kubelet of one Node of the real control plane (control_plane.kubelets): its pods are
those bound to that Node in every namespace, each on a loopback address of its own (.network)
with its service-account token projected; once a deleted pod's processes stopped, the agent
deletes it with grace 0, as a kubelet ends a deletion (.reporting).
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import subprocess
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ddpjob_sandbox.client import ApiError, KubeClient
from ddpjob_sandbox.node.container import ContainerReader, PodProcess
from ddpjob_sandbox.node.launch import (
    NODE_ENV, POD_ENV, ContainerLaunch, Placement, UnsupportedPodError, container_launch, mounts, pod_dir, volume_dirs,
)
from ddpjob_sandbox.node.network import Resolver, network_env, pod_ip
from ddpjob_sandbox.node.projection import Projector, in_cluster_env, service_account_dir
from ddpjob_sandbox.node.reporting import PodReporter
from ddpjob_sandbox.pod_status import (
    back_off_status, now_rfc3339, running_status, terminated_state, terminated_status, waiting_status,
)
from ddpjob_sandbox.procs import holds_socket, kill_marked, listening_socket_inodes, marked_pids

log = logging.getLogger(__name__)

DEFAULT_GRACE_SECONDS = 30  # the API's default terminationGracePeriodSeconds
MAX_GRACE_SECONDS = 5.0  # the sandbox's cap on a pod's grace period, so a deletion in a test is quick
# A kubelet's crash-loop back-off: the first restart at once, then 10 s, doubled each time, at
# most 5 min; a container that ran 10 min without exiting starts over from the first.
RESTART_BACK_OFF_SECONDS = 10.0
MAX_RESTART_BACK_OFF_SECONDS = 300.0
BACK_OFF_RESET_SECONDS = 600.0
# A kubelet renews a projected token once it is older than 80% of its lifetime (or 24 h).
TOKEN_RENEW_FRACTION = 0.8
TOKEN_RENEW_MAX_SECONDS = 24 * 3600.0
TOKEN_RETRY_SECONDS = 10.0  # a refused renewal is tried again this much later


def restarts(policy: str | None, exit_code: int) -> bool:
    """Whether a kubelet starts an exited container again under the pod's restartPolicy.

    The API server defaults restartPolicy to Always, so a pod read from it always has one; a
    policy that is missing (a pod body built by hand) reads as Never."""
    return policy == "Always" or (policy == "OnFailure" and exit_code != 0)


@dataclasses.dataclass
class Restarts:
    """One pod's restarts: how many, the next back-off, when the next start is due, how the
    last container ended (its ``terminated`` state, reported as lastState)."""

    count: int = 0
    back_off: float = 0.0  # 0: the next restart is at once
    due: float | None = None  # monotonic time of the pending restart
    last: dict | None = None

    def after_exit(self, ran_seconds: float, last: dict, first_back_off: float) -> float:
        """Schedules the restart of a container that ran ``ran_seconds``; returns the wait."""
        if ran_seconds >= BACK_OFF_RESET_SECONDS:
            self.back_off = 0.0
        wait = self.back_off
        self.due = time.monotonic() + wait
        self.back_off = min(2 * self.back_off, MAX_RESTART_BACK_OFF_SECONDS) if self.back_off else first_back_off
        self.last = last
        return wait


@dataclasses.dataclass
class TokenRenewal:
    """When a running pod's projected tokens are next renewed, and where its volumes are."""

    due: float  # monotonic
    placement: Placement


class AddressBusy(UnsupportedPodError):
    """The pod's address is held by the still-running old container of a pod of the same name."""


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


class NodeAgent(ContainerReader):
    """Runs its pods as local process trees and reports their status.

    Args:
        client: an API client logged in as the Node's kubelet (system:node:<node_name>).
        root: the node's directory (claims, per-pod dirs and container logs).
        poll_seconds: how often pods and processes are looked at.
        max_grace_seconds: cap on a pod's terminationGracePeriodSeconds (tests stay fast; a
            capped pod is logged, see capped_grace).
        images: image name -> the Python environment standing for it (ddpjob_sandbox.images,
            node.launch.container_launch); other images run in this interpreter's environment.
        node_name: serve the pods bound to this Node in every namespace, as its kubelet.
        api_url: the API server a pod's processes reach (service-account pods get a
            kubeconfig for it; see projection.in_cluster_env).
        node_id: the value of the marker every process of this agent carries (NODE_ENV);
            a caller that must find them from another process (``make cluster-down``) names it.
        dns_client: who answers for cluster DNS (lists a namespace's Services and pods); a
            kubelet may list only its own pods, so on a real API server it is the imitated
            DNS's own identity. Default: ``client``.
        restart_back_off_seconds: the crash-loop back-off before the second restart of a
            container (doubled after each, see Restarts).
        token_renew_fraction: a projected token is renewed once this fraction of its lifetime
            passed (a kubelet's 0.8; a test shortens it).
    """

    def __init__(self, client: KubeClient, root: Path, *, node_name: str, poll_seconds: float = 0.1,
                 max_grace_seconds: float = MAX_GRACE_SECONDS, images: Mapping[str, Path] | None = None,
                 api_url: str | None = None, node_id: str | None = None, dns_client: KubeClient | None = None,
                 restart_back_off_seconds: float = RESTART_BACK_OFF_SECONDS,
                 token_renew_fraction: float = TOKEN_RENEW_FRACTION):
        self.client = client
        self.dns = PodReporter(dns_client or client)
        self.reporter = PodReporter(client)
        self.node_name = node_name
        self.api_url = api_url
        self.projector = Projector(client)
        self.root = Path(root)
        self.poll_seconds = poll_seconds
        self.max_grace_seconds = max_grace_seconds
        self.images = dict(images or {})
        self.node_id = node_id or uuid.uuid4().hex[:12]
        self.pods: dict[str, PodProcess] = {}  # uid -> container, finished ones kept for tests
        self.rejected: dict[str, str] = {}  # uid -> why the pod could not start
        self.restart_back_off_seconds = restart_back_off_seconds
        self.token_renew_fraction = token_renew_fraction
        self.restarts: dict[str, Restarts] = {}  # uid -> restarts of a pod whose container exited
        self.renewals: dict[str, TokenRenewal] = {}  # uid -> token renewal of a pod that runs
        self.errors: list[str] = []  # exceptions the loop survived (API down, a write racing a deletion)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"sandbox-node-agent-{node_name}", daemon=True)

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

    def diagnosis(self) -> str:
        return f"rejected pods: {self.rejected}; loop errors: {self.errors[-3:]}"

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
        observed = {p["metadata"]["uid"]: p for p in self.reporter.node_pods(self.node_name)}
        for uid, pod in observed.items():
            if uid in self.pods:
                continue
            if pod["metadata"].get("deletionTimestamp"):
                self.reporter.delete_now(pod)  # deleted before (or instead of) starting: nothing to stop
            elif uid not in self.rejected and (pod.get("status") or {}).get("phase") in (None, "Pending"):
                self._start(pod)
        with self._lock:
            containers = list(self.pods.values())
        for container in containers:
            self._follow(container, observed.get(container.uid))

    def placement(self, pod: dict) -> Placement:
        """Where ``pod`` lives on this node: an address of its own, its namespace's DNS names, its
        claims' volumes and its listen address.

        Raises:
            UnsupportedPodError: another running pod of this node holds the address.
        """
        meta = pod["metadata"]
        namespace = meta["namespace"]
        address = pod_ip(namespace, meta["name"])
        with self._lock:
            holder = next((c for c in self.pods.values() if c.pod_ip == address and c.exit_code is None), None)
        if holder is not None and (holder.namespace, holder.name) == (namespace, meta["name"]):
            # The address is the name's: a replacement under the same name (a node pod re-created after
            # its predecessor was deleted) waits until this loop has stopped and reaped the old container,
            # where a real kubelet would give it a fresh address at once. Refused, it would stay Pending.
            raise AddressBusy(f"pod address {address} is still held by the old container of {meta['name']}")
        if holder is not None:
            raise UnsupportedPodError(f"pod address {address} is held by pod {holder.namespace}/{holder.name} "
                                      "on this node (a hash collision); delete one of them")
        resolver = Resolver(namespace, self.dns.services(namespace), self.dns.client.list("pods", namespace))
        return Placement(pod_ip=address, resolve=resolver, claims=self.reporter.claim_dirs(pod),
                         env=network_env(address))

    def _prepare(self, pod: dict) -> tuple[Placement, ContainerLaunch]:
        """The pod's placement and launch, its API-backed volumes filled (token, ConfigMaps...)
        and the renewal of its tokens planned."""
        meta = pod["metadata"]
        placement = self.placement(pod)
        dirs = volume_dirs(pod, self.root, placement.claims)
        try:
            lifetime = self.projector.fill(pod, dirs, placement)
        except ApiError as e:
            raise UnsupportedPodError(f"volumes of pod {meta['name']} cannot be filled: {e}") from None
        if lifetime is not None:
            self.renewals[meta["uid"]] = TokenRenewal(self._renew_at(lifetime), placement)
        account_dir = service_account_dir(pod, dirs)
        if account_dir is not None and self.api_url:
            placement = dataclasses.replace(placement, env={**placement.env, **in_cluster_env(
                pod, account_dir, self.root, self.api_url)})
        services = placement.resolve.service_names  # placement() resolves with a Resolver of the namespace
        return placement, container_launch(pod, self.root, services, os.environ, self.images, placement=placement)

    def _renew_at(self, lifetime: float) -> float:
        return time.monotonic() + min(self.token_renew_fraction * lifetime, TOKEN_RENEW_MAX_SECONDS)

    def _renew_tokens(self, pod: dict, renewal: TokenRenewal) -> None:
        """Writes new tokens into a running pod's volumes (and its kubeconfig), as a kubelet
        does before the old ones expire; a refusal is tried again TOKEN_RETRY_SECONDS later."""
        dirs = volume_dirs(pod, self.root, renewal.placement.claims)
        try:
            lifetime = self.projector.fill(pod, dirs, renewal.placement, only_tokens=True)
        except (ApiError, OSError) as e:
            self.errors.append(f"renewing the tokens of pod {pod['metadata']['name']}: {e!r}")
            renewal.due = time.monotonic() + TOKEN_RETRY_SECONDS
            return
        account_dir = service_account_dir(pod, dirs)
        if account_dir is not None and self.api_url:
            in_cluster_env(pod, account_dir, self.root, self.api_url)
        renewal.due = self._renew_at(lifetime) if lifetime is not None else float("inf")

    def _start(self, pod: dict) -> None:
        meta = pod["metadata"]
        container_name = pod["spec"]["containers"][0]["name"]
        try:
            placement, launch = self._prepare(pod)
        except AddressBusy:
            return  # started by a later tick, once the old container is gone
        except UnsupportedPodError as e:
            self.rejected[meta["uid"]] = str(e)
            self.reporter.patch_status(meta["name"], waiting_status(container_name, str(e)),
                                       namespace=meta.get("namespace"))
            return
        volumes = volume_dirs(pod, self.root, placement.claims)
        # The kubelet creates a mount's subPath inside its volume when it is missing.
        subpaths = [local for _, local in mounts(pod["spec"]["containers"][0], volumes)]
        for directory in (launch.cwd, *volumes.values(), *subpaths):
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
                               fallback_to_logs=spec.get("terminationMessagePolicy") == "FallbackToLogsOnError",
                               pod_ip=placement.pod_ip)
        restarted = self.restarts.get(meta["uid"])
        with self._lock:
            self.pods[meta["uid"]] = container
            if restarted is not None:
                restarted.count += 1
                restarted.due = None
        self.reporter.patch_status(meta["name"], running_status(
            container_name, container.started_at, placement.pod_ip, placement.host_ip,
            restart_count=restarted.count if restarted else 0, last_terminated=restarted.last if restarted else None),
            uid=meta["uid"], namespace=meta["namespace"])

    def _follow(self, container: PodProcess, pod: dict | None) -> None:
        """Moves one container on: renew its tokens, report its exit (and restart it where the
        pod's restartPolicy says so), stop it when its pod is deleted or gone."""
        deleting = pod is None or bool(pod["metadata"].get("deletionTimestamp"))
        if deleting:
            container.terminate()
        if container.poll() is None:
            renewal = self.renewals.get(container.uid)
            if renewal is not None and not deleting and time.monotonic() >= renewal.due:
                self._renew_tokens(pod, renewal)
            return
        if not container.reported and pod is not None:
            self._report_exit(container, pod, deleting)
            container.reported = True
        if deleting:
            self.restarts.pop(container.uid, None)
            self.renewals.pop(container.uid, None)
            if pod is not None:
                self.reporter.delete_now(pod)  # the processes stopped: the deletion ends
            return
        restart = self.restarts.get(container.uid)
        if restart is not None and restart.due is not None and time.monotonic() >= restart.due \
                and container.uid not in self.rejected:  # a restart that cannot start is not tried each tick
            self._start(pod)

    def _report_exit(self, container: PodProcess, pod: dict, deleting: bool) -> None:
        """The exit of a container: for good (the phase follows), or with a restart scheduled
        (still Running; CrashLoopBackOff while the back-off lasts)."""
        name = pod["spec"]["containers"][0]["name"]
        last = terminated_state(container.started_at, container.finished_at, container.exit_code,
                                container.termination_message())
        restart = self.restarts.get(container.uid)
        if deleting or not restarts(pod["spec"].get("restartPolicy"), container.exit_code):
            body = terminated_status(name, container.started_at, container.finished_at, container.exit_code,
                                     last.get("message"), restart_count=restart.count if restart else 0)
            self.renewals.pop(container.uid, None)  # nothing runs to read a token any more
        else:
            restart = self.restarts.setdefault(container.uid, Restarts())
            wait = restart.after_exit(time.monotonic() - container.started_monotonic, last,
                                      self.restart_back_off_seconds)
            if not wait:
                return  # started again on this tick; its running status carries lastState
            body = back_off_status(name, f"{container.name}_{container.namespace}({container.uid})", restart.count,
                                   last, wait)
        self.reporter.patch_status(container.name, body, uid=container.uid, namespace=container.namespace)

