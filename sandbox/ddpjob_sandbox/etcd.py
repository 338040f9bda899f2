"""A real etcd server for tests: Debian's etcd 3.4 on free loopback ports, always stopped.

torch's built-in etcd rendezvous backends speak etcd's v2 API, so the server
is started with ``--enable-v2``; the v3 API is always on.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from ddpjob_sandbox.procs import free_port, stop_process_group


@dataclass
class EtcdServer:
    """A running etcd: ``endpoint`` is ``127.0.0.1:PORT`` for clients."""

    host: str
    port: int
    peer_port: int
    data_dir: Path
    process: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.endpoint}"

    def start(self, timeout: float = 20.0) -> None:
        binary = shutil.which("etcd")
        if binary is None:
            raise RuntimeError("etcd is not installed: run scripts/install-system-deps.sh (Debian etcd-server)")
        log = open(self.data_dir / "etcd.log", "ab")
        self.process = subprocess.Popen(
            [
                binary,
                "--name=test",
                f"--data-dir={self.data_dir / 'data'}",
                f"--listen-client-urls={self.url}",
                f"--advertise-client-urls={self.url}",
                f"--listen-peer-urls=http://{self.host}:{self.peer_port}",
                f"--initial-advertise-peer-urls=http://{self.host}:{self.peer_port}",
                f"--initial-cluster=test=http://{self.host}:{self.peer_port}",
                "--enable-v2=true",
                "--log-level=error",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.process.returncode}; see {self.data_dir / 'etcd.log'}")
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{self.url}/health", timeout=1) as response:
                    if b"true" in response.read():
                        return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"etcd did not become healthy within {timeout} s on {self.endpoint}")

    def stop(self) -> None:
        if self.process is not None:
            stop_process_group(self.process)
            self.process = None

    def restart(self) -> None:
        """Stops and starts the same member on the same ports and data (an etcd outage)."""
        self.stop()
        self.start()


@contextlib.contextmanager
def running_etcd(data_dir: Path | None = None):
    """Yields a started :class:`EtcdServer`; stops it and removes its data on exit."""
    with contextlib.ExitStack() as stack:
        if data_dir is None:
            data_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="etcd-")))
        server = EtcdServer(host="127.0.0.1", port=free_port(), peer_port=free_port(), data_dir=data_dir)
        server.start()
        stack.callback(server.stop)
        yield server


def etcdctl(server: EtcdServer, *args: str, user: str | None = None) -> str:
    """Runs etcdctl (v3 API) against `server` as `user` ("name:password"); its stdout. Fails on a non-zero exit."""
    command = ["etcdctl", f"--endpoints={server.endpoint}", *([f"--user={user}"] if user else []), *args]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "ETCDCTL_API": "3"},
                          timeout=30)
    if done.returncode != 0:
        raise AssertionError(f"{command}: {done.stderr}")
    return done.stdout
