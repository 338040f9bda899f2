"""A real etcd server for tests and benches, on free loopback ports, always stopped: the one place
an etcd is started.

Which etcd (ddpjob_sandbox.binaries): the v3 API from the pinned etcd 3.6 in .cluster/bin/ (``make
cluster-binaries``), the release ddpjob's etcd-v3 rendezvous is pitched for, whose v2 API is
gone; the v2 API (``api="v2"``) from Debian's etcd 3.4 with ``--enable-v2``, only where torch's
own ``etcd`` backend runs (api_for_backend). A missing binary raises MissingBinaryError naming
the command that provides it. ``tls`` serves clients over mutual TLS.
"""
from __future__ import annotations

import contextlib
import json
import os
import ssl
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from ddpjob_sandbox.binaries import DEFAULT_BIN_DIR, debian, pinned
from ddpjob_sandbox.procs import free_port, stop_process_group

V3, V2 = "v3", "v2"
# torch's own etcd rendezvous backends, both on etcd's v2 API (python-etcd): ``etcd``
# (etcd_rendezvous.py) and ``etcd-v2`` (etcd_rendezvous_backend.py).
TORCH_V2_BACKENDS = ("etcd", "etcd-v2")


def api_for_backend(backend: str) -> str:
    """The etcd API a rendezvous backend speaks: v2 for torch's, v3 for ddpjob's etcd-v3."""
    return V2 if backend in TORCH_V2_BACKENDS else V3


@dataclass(frozen=True)
class EtcdTls:
    """Mutual TLS: the server's certificate and key, the CA it trusts for client certificates,
    and a client certificate (the health check presents it)."""

    ca: Path
    cert: Path
    key: Path
    client_cert: Path
    client_key: Path

    def args(self) -> list[str]:
        return [f"--cert-file={self.cert}", f"--key-file={self.key}", f"--trusted-ca-file={self.ca}",
                "--client-cert-auth"]

    def client_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca))
        context.load_cert_chain(str(self.client_cert), str(self.client_key))
        return context


@dataclass
class EtcdServer:
    """A running etcd: ``endpoint`` is ``127.0.0.1:PORT`` for clients."""

    host: str
    port: int
    peer_port: int
    data_dir: Path
    api: str = V3
    tls: EtcdTls | None = None
    bin_dir: Path = DEFAULT_BIN_DIR  # where the pinned etcd 3.6 is (api v3)
    process: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.endpoint}"

    def binary(self, name: str = "etcd") -> Path:
        """etcd or etcdctl of this server's release (MissingBinaryError says how to get it)."""
        return debian(name) if self.api == V2 else pinned(name, self.bin_dir)

    def argv(self) -> list[str]:
        peer = f"http://{self.host}:{self.peer_port}"
        return [str(self.binary()), "--name=test", f"--data-dir={self.data_dir / 'data'}",
                f"--listen-client-urls={self.url}", f"--advertise-client-urls={self.url}",
                f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=test={peer}", "--log-level=error",
                *(["--enable-v2=true"] if self.api == V2 else []), *(self.tls.args() if self.tls else [])]

    def start(self, timeout: float = 20.0) -> None:
        argv = self.argv()  # before the log opens: a missing binary raises here
        with open(self.data_dir / "etcd.log", "ab") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.process.returncode}; see {self.data_dir / 'etcd.log'}")
            with contextlib.suppress(OSError):
                if self.get("/health").get("health") == "true":
                    return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"etcd did not become healthy within {timeout} s on {self.endpoint}")

    def get(self, path: str) -> dict:
        """GET ``path`` of the server's HTTP API (/health, /version), decoded."""
        context = self.tls.client_context() if self.tls else None
        with urllib.request.urlopen(f"{self.url}{path}", timeout=1, context=context) as response:
            return json.loads(response.read())

    def stop(self) -> None:
        if self.process is not None:
            stop_process_group(self.process)
            self.process = None

    def restart(self) -> None:
        """Stops and starts the same member on the same ports and data (an etcd outage)."""
        self.stop()
        self.start()


@contextlib.contextmanager
def running_etcd(data_dir: Path | None = None, *, api: str = V3, tls: EtcdTls | None = None,
                 bin_dir: Path = DEFAULT_BIN_DIR):
    """Yields a started :class:`EtcdServer` (see the module docstring for ``api`` and ``tls``);
    stops it and removes its data on exit."""
    with contextlib.ExitStack() as stack:
        if data_dir is None:
            data_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="etcd-")))
        server = EtcdServer(host="127.0.0.1", port=free_port(), peer_port=free_port(), data_dir=data_dir,
                            api=api, tls=tls, bin_dir=bin_dir)
        server.start()
        stack.callback(server.stop)
        yield server


def etcdctl(server: EtcdServer, *args: str, user: str | None = None) -> str:
    """Runs the server's own etcdctl (v3 API) against `server` as `user` ("name:password"); its
    stdout. Fails on a non-zero exit."""
    command = [str(server.binary("etcdctl")), f"--endpoints={server.endpoint}",
               *([f"--user={user}"] if user else []), *args]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "ETCDCTL_API": "3"},
                          timeout=30)
    if done.returncode != 0:
        raise AssertionError(f"{command}: {done.stderr}")
    return done.stdout
