"""Starting and stopping the control plane's processes, every wait bounded.

Each component runs as the leader of its own process group with its output in
``<root>/logs/<name>.log``; ``<root>/state.json`` records the pids, so ``down`` finds
them from another process (``make cluster-down``) and stops each whole group. A pid
is only signalled while its command line is still the component's binary: a pid the
system reused for something else is left alone.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ddpjob_sandbox.binaries import BUILD_COMMAND
from ddpjob_sandbox.client import ApiError, KubeClient
from ddpjob_sandbox.control_plane import components as comp
from ddpjob_sandbox.control_plane.pki import CLIENTS, make_pki
from ddpjob_sandbox.procs import free_port

BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
LOG_TAIL_LINES = 40
STOP_GRACE_SECONDS = 10.0


class ControlPlaneError(RuntimeError):
    """A component did not start (the message carries its log's tail) or a binary is missing."""


@dataclass(frozen=True)
class Component:
    name: str
    argv: list[str]
    healthy: Callable[[], bool]
    timeout: float
    env: Mapping[str, str] | None = None  # None: this process's environment


def missing_binaries(bin_dir: Path) -> list[str]:
    return [b for b in BINARIES if not os.access(bin_dir / b, os.X_OK)]


def require_binaries(bin_dir: Path) -> None:
    """Raises ControlPlaneError naming the missing binaries and the command that builds them."""
    missing = missing_binaries(bin_dir)
    if missing:
        raise ControlPlaneError(f"{', '.join(missing)} not found in {bin_dir}: build them with {BUILD_COMMAND}")


def new_layout(root: Path, bin_dir: Path, node_monitor_grace_seconds: int = comp.NODE_MONITOR_GRACE_SECONDS,
               apiserver_flags: tuple[str, ...] = ()) -> comp.Layout:
    ports = comp.Ports(etcd=free_port(), etcd_peer=free_port(), apiserver=free_port(),
                       controller_manager=free_port(), scheduler=free_port())
    return comp.Layout(root=root.resolve(), bin_dir=bin_dir.resolve(), ports=ports,
                       node_monitor_grace_seconds=node_monitor_grace_seconds, apiserver_flags=apiserver_flags)


def admin_ssl_context(layout: comp.Layout) -> ssl.SSLContext:
    """TLS as the admin: the cluster's CA trusted, the admin's client certificate presented."""
    context = ssl.create_default_context(cafile=str(layout.pki / "ca.crt"))
    context.load_cert_chain(str(layout.pki / "admin.crt"), str(layout.pki / "admin.key"))
    return context


def admin_client(layout: comp.Layout, namespace: str = "default") -> KubeClient:
    """A KubeClient logged in as the admin (system:masters) over the cluster's TLS."""
    return KubeClient(layout.apiserver_url, layout.kubeconfig("admin"), namespace,
                      ssl_context=admin_ssl_context(layout), kubectl=str(layout.bin_dir / "kubectl"))


def _answers_ok(url: str, context: ssl.SSLContext | None = None) -> bool:
    with contextlib.suppress(OSError, urllib.error.URLError):
        with urllib.request.urlopen(url, timeout=2, context=context) as response:
            return response.status == 200
    return False


def components(layout: comp.Layout) -> list[Component]:
    """The components in start order, each with its health check."""
    # The controller manager and the scheduler serve /healthz with a certificate they made
    # themselves at start; nothing to verify it against, and it is loopback.
    self_signed = ssl._create_unverified_context()  # noqa: S323 - loopback health probe only
    return [
        Component("etcd", comp.etcd_argv(layout), lambda: _answers_ok(f"{layout.etcd_url}/health"), 30),
        Component("kube-apiserver", comp.apiserver_argv(layout),
                  lambda: _answers_ok(f"{layout.apiserver_url}/readyz", admin_ssl_context(layout)), 180),
        Component("kube-controller-manager", comp.controller_manager_argv(layout),
                  lambda: _answers_ok(f"https://127.0.0.1:{layout.ports.controller_manager}/healthz", self_signed), 90),
        Component("kube-scheduler", comp.scheduler_argv(layout),
                  lambda: _answers_ok(f"https://127.0.0.1:{layout.ports.scheduler}/healthz", self_signed), 90),
    ]


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return "(no log)"


def prepare(layout: comp.Layout) -> None:
    """Certificates, kubeconfigs and the audit policy; a fresh etcd data dir."""
    require_binaries(layout.bin_dir)
    make_pki(layout.pki)
    layout.logs.mkdir(parents=True, exist_ok=True)
    for identity in CLIENTS:
        path = layout.kubeconfig(identity.stem)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(comp.kubeconfig_text(layout.pki, layout.apiserver_url, identity.stem))
    (layout.root / "audit-policy.yaml").write_text(comp.AUDIT_POLICY)
    # A new cluster each time: its ports are new, and etcd remembers the old peer address.
    shutil.rmtree(layout.root / "etcd", ignore_errors=True)


def _wait_healthy(component: Component, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + component.timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ControlPlaneError(f"{component.name} exited with {process.returncode}; {log} ends:\n{log_tail(log)}")
        if component.healthy():
            return
        time.sleep(0.2)
    raise ControlPlaneError(f"{component.name} not healthy within {component.timeout:.0f} s; {log} ends:\n"
                            f"{log_tail(log)}")


def state_path(root: Path) -> Path:
    return root / "state.json"


def _record(root: Path, started: dict[str, subprocess.Popen], layout: comp.Layout) -> None:
    state = {"ports": layout.ports.__dict__, "apiserver": layout.apiserver_url,
             "processes": {name: {"pid": p.pid, "binary": p.args[0]} for name, p in started.items()}}
    tmp = state_path(root).with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(state_path(root))


def up(layout: comp.Layout) -> dict[str, subprocess.Popen]:
    """Starts every component in order, each healthy before the next; on a failure stops what started.

    Raises:
        ControlPlaneError: a binary is missing, or a component exited or stayed unhealthy
            past its timeout (with the tail of its log).
    """
    prepare(layout)
    started: dict[str, subprocess.Popen] = {}
    try:
        for component in components(layout):
            launch(layout, component, started)
        bootstrap(layout)
    except BaseException:
        down(layout.root)
        raise
    return started


def bootstrap(layout: comp.Layout) -> None:
    """What a kubeadm cluster's add-ons install: the cluster DNS's rights (kept where present)."""
    client = admin_client(layout)
    for body in comp.CLUSTER_DNS_RBAC:
        path = f"/apis/rbac.authorization.k8s.io/v1/{body['kind'].lower()}s"
        try:
            client.request("POST", path, body)
        except ApiError as e:
            if e.status != 409:
                raise ControlPlaneError(f"{body['kind']} {body['metadata']['name']} was refused: {e}") from None


def launch(layout: comp.Layout, component: Component, started: dict[str, subprocess.Popen]) -> None:
    """Starts one component in a session of its own, records it in state.json and waits until it is
    healthy (ControlPlaneError with its log's tail otherwise); the caller stops what started on failure."""
    log = layout.logs / f"{component.name}.log"
    with open(log, "ab") as out:
        started[component.name] = subprocess.Popen(
            component.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, env=None if component.env is None else dict(component.env))
    _record(layout.root, started, layout)
    _wait_healthy(component, started[component.name], log)


def etcdctl(layout: comp.Layout, *args: str) -> str:
    """Runs the pinned etcdctl against this control plane's etcd; returns its output.

    Raises:
        ControlPlaneError: etcdctl is missing (with the command that builds it) or failed.
    """
    binary = layout.bin_dir / "etcdctl"
    if not os.access(binary, os.X_OK):
        raise ControlPlaneError(f"etcdctl not found in {layout.bin_dir}: build it with {BUILD_COMMAND}")
    done = subprocess.run([str(binary), f"--endpoints={layout.etcd_url}", *args], capture_output=True, text=True,
                          timeout=60)
    if done.returncode:
        raise ControlPlaneError(f"etcdctl {' '.join(args)} exited with {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def compact_etcd(layout: comp.Layout) -> int:
    """Compacts etcd's history up to its current revision, as the API server does every 5 min
    (--etcd-compaction-interval); a watch from an older resourceVersion that reaches etcd then
    ends with 410 Gone. Returns the revision compacted to."""
    (status,) = json.loads(etcdctl(layout, "endpoint", "status", "--write-out=json"))
    revision = int(status["Status"]["header"]["revision"])
    etcdctl(layout, "compact", str(revision), "--physical")
    return revision


def _is_component(pid: int, binary: str) -> bool:
    """Whether ``pid`` still runs ``binary`` (and is not a zombie or a reused pid)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    except OSError:
        return False
    return cmdline == binary


def _group_gone(pid: int) -> bool:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reap our own child, else its zombie keeps the group alive
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass
    return False


def _stop_group(pid: int, grace: float) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and not _group_gone(pid):
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and not _group_gone(pid):
        time.sleep(0.1)


def down(root: Path, grace: float = STOP_GRACE_SECONDS) -> list[str]:
    """Stops every recorded component (the last started first); returns the names it stopped."""
    path = state_path(root)
    if not path.exists():
        return []
    processes = json.loads(path.read_text())["processes"]
    stopped = []
    for name, entry in reversed(list(processes.items())):
        if _is_component(entry["pid"], entry["binary"]):
            _stop_group(entry["pid"], grace)
            stopped.append(name)
    path.unlink()
    return stopped


def running(root: Path) -> list[str]:
    """The recorded components whose process is still alive."""
    path = state_path(root)
    if not path.exists():
        return []
    processes = json.loads(path.read_text())["processes"]
    return [name for name, e in processes.items() if _is_component(e["pid"], e["binary"])]
