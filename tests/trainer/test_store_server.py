"""The standalone rendezvous store: it serves a TCPStore that clients share, and a SIGTERM (the
kubelet's stop) ends it cleanly. As a store pod runs it (`python -c <ddpjob_rdzv/store_program.py>`,
in an environment with torch and no ddpjob: a plain PyTorch image) and as
`python -m ddpjob_trainer.store_server` (its older command, still in the trainer image)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from ddpjob_operator.render.store_pod import store_command
from ddpjob_trainer.listen import tcp_store_server
from tests.support.listeners import listeners

from ddpjob_sandbox.node.launch import base_env
from ddpjob_sandbox.procs import free_port, start_in_own_group, stop_process_group


def wait_for_line(process: subprocess.Popen, needle: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if needle in line:
            return line
        if not line and process.poll() is not None:
            break
    raise AssertionError(f"no {needle!r} from the store (exit code {process.poll()})")


@pytest.fixture(params=["store pod's program in a torch-only image", "python -m ddpjob_trainer.store_server"])
def store_argv(request, torch_only_env) -> tuple[list[str], dict[str, str]]:
    """The store's command (without its arguments) and environment, each way it is started;
    in the torch-only image as the sandbox node starts a container of it (base_env)."""
    if request.param.startswith("store pod"):
        return store_command(str(torch_only_env / "bin" / "python")), base_env(os.environ, torch_only_env)
    return [sys.executable, "-m", "ddpjob_trainer.store_server"], dict(os.environ)


def start_store(store: tuple[list[str], dict[str, str]], *args: str) -> subprocess.Popen:
    argv, env = store
    return start_in_own_group([*argv, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def test_the_store_serves_clients_and_exits_0_on_sigterm(store_argv):
    port = free_port()
    store = start_store(store_argv, "--port", str(port))
    try:
        assert f":{port}" in wait_for_line(store, "listening")
        writer = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))
        reader = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))
        writer.set("rdzv/state", "round-1")
        assert reader.get("rdzv/state") == b"round-1"
        assert reader.add("rdzv/count", 2) == 2 and writer.add("rdzv/count", 1) == 3
        store.send_signal(signal.SIGTERM)
        assert store.wait(timeout=15) == 0
    finally:
        stop_process_group(store)


def test_help_answers_without_importing_torch():
    result = subprocess.run([sys.executable, "-m", "ddpjob_trainer.store_server", "--help"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "--port" in result.stdout
    probe = subprocess.run([sys.executable, "-c", "import sys, ddpjob_trainer.store_server; print('torch' in sys.modules)"],
                           capture_output=True, text=True, timeout=60)
    assert probe.stdout.strip() == "False"


def test_the_old_module_path_still_starts_the_store():
    """Store pods rendered before the rename run `python -m ddpjob_trainer.rdzv_store`."""
    result = subprocess.run([sys.executable, "-m", "ddpjob_trainer.rdzv_store", "--help"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "--port" in result.stdout, result.stderr


def test_the_store_listens_only_on_the_host_it_is_given(store_argv):
    """torch's TCPStore alone listens on every interface (`*:<port>`) whatever host it is given."""
    port = free_port()
    store = start_store(store_argv, "--host", "127.0.0.1", "--port", str(port))
    try:
        wait_for_line(store, "listening")
        found = [(s.address, s.port) for s in listeners({store.pid})]
        assert found == [("127.0.0.1", port)], found
        client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))
        client.set("k", "v")
        assert client.get("k") == b"v"
    finally:
        stop_process_group(store)


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_tcp_store_server_binds_the_given_loopback_address_only(host):
    server = tcp_store_server(host, 0, wait_for_workers=False, timeout=timedelta(seconds=10))
    found = [(s.address, s.port) for s in listeners({os.getpid()}) if s.port == server.port]
    assert found == [(host, server.port)], found
    client = dist.TCPStore(host, server.port, is_master=False, timeout=timedelta(seconds=10))
    client.set("k", "v")
    assert server.get("k") == b"v"
