"""Workers forked from a per-node server that imported torch once (ddpjob_trainer.zygote),
driven as torchrun drives a worker: a process per worker, its exit code, its signals."""
import os
import secrets
import socket
import signal
import subprocess
import sys
import time
import uuid

import pytest

from ddpjob_sandbox.procs import kill_marked_until_gone
from ddpjob_sandbox.torchrun import MARKER_ENV

# A worker module: reports whether torch was already imported when it started (it was,
# in the server), who its parent is, and exits with the code it is given (3 on SIGTERM).
WORKER = '''
import os, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(3))
if sys.argv[1] == "sleep":
    with open(sys.argv[2], "w") as out:  # complete before the line below tells the test to read it
        out.write(str(os.getpid()))
print("torch preloaded", "torch" in sys.modules, "parent", os.getppid(), "argv", sys.argv[1:], flush=True)
if sys.argv[1] == "sleep":
    time.sleep(60)
sys.exit(int(sys.argv[1]))
'''


@pytest.fixture
def zygote(tmp_path):
    """Runs `python -m ddpjob_trainer.zygote zy_worker ARGS` under a shell standing in for the agent."""
    (tmp_path / "zy_worker.py").write_text(WORKER)
    marker = uuid.uuid4().hex  # every process of this test, the server its client starts included
    # The shell stands in for the agent: it hands its workers the token, as torchrun's agent does.
    env = {**os.environ, "DDPJOB_ZYGOTE_SOCKET": str(tmp_path / "zygote" / "socket"), MARKER_ENV: marker,
           "DDPJOB_ZYGOTE_TOKEN": secrets.token_hex(32),
           "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    started = []

    def start(*args: str, shell: bool = True) -> subprocess.Popen:
        """One worker per `args` list (several in turn when given lists), under one agent."""
        runs = args if args and isinstance(args[0], list) else [list(args)]
        argvs = [[sys.executable, "-m", "ddpjob_trainer.zygote", "zy_worker", *run] for run in runs]
        script = "; ".join(" ".join(argv) + "; echo exit $?" for argv in argvs)
        command = ["sh", "-c", script] if shell else argvs[0]
        # A session of its own, as torchrun gives each worker: the group it signals.
        process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True)
        started.append(process)
        return process

    yield start
    for process in started:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    # Without the shell this test process is the client's parent, so the server, which leaves with
    # that agent, would stay until the session ends: it goes with the test.
    kill_marked_until_gone(marker, key=MARKER_ENV)


def facts(line: str) -> tuple[bool, int]:
    words = line.split()
    return words[2] == "True", int(words[4])


def wait_gone(pid: int, timeout: float = 20) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split(")")[-1].split()[0] == "Z":
            return True
        time.sleep(0.05)
    return False


def test_workers_start_with_torch_already_imported_and_give_torchrun_their_exit_code(zygote):
    agent = zygote(["7"], ["0"])  # two workers in turn, as after a restart
    assert agent.wait(timeout=120) == 0
    first, code1, second, code2 = agent.stdout.read().splitlines()
    (preloaded, server), (_, server2) = facts(first), facts(second)
    assert (code1, code2) == ("exit 7", "exit 0")
    assert preloaded, "the server imported torch before forking the worker"
    assert server2 == server, "one server per node, kept between workers"
    assert wait_gone(server), "the server leaves once the agent that started it is gone"


def test_torchruns_sigterm_reaches_the_worker_and_its_exit_code_comes_back(zygote, tmp_path):
    client = zygote("sleep", str(tmp_path / "pid"), shell=False)
    client.stdout.readline()
    os.killpg(client.pid, signal.SIGTERM)  # as torchrun stops a worker: its process group
    assert client.wait(timeout=30) == 3, "the worker's SIGTERM handler ran and its exit code came back"


def test_a_sigkilled_client_takes_its_worker_along(zygote, tmp_path):
    process = zygote("sleep", str(tmp_path / "pid"))
    process.stdout.readline()
    worker = int((tmp_path / "pid").read_text())
    os.killpg(process.pid, signal.SIGKILL)  # the worker runs in a session of its own: only the pipe tells it
    assert wait_gone(worker), "the worker outlived the process torchrun watches"



# An agent stand-in: starts the node's server as its rendezvous handler does, then one worker.
AGENT = """
import subprocess, sys
from ddpjob_trainer import zygote
print("server", zygote.prestart().process.pid, flush=True)
sys.exit(subprocess.call([sys.executable, "-m", "ddpjob_trainer.zygote", "zy_worker", "5"]))
"""


def test_an_agent_starts_its_nodes_server_before_its_first_worker_which_then_uses_it(tmp_path):
    (tmp_path / "zy_worker.py").write_text(WORKER)
    env = {**os.environ, "DDPJOB_ZYGOTE_SOCKET": str(tmp_path / "zygote" / "socket"),
           "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.pop("DDPJOB_ZYGOTE_TOKEN", None)  # the agent makes its own
    # A file, not a pipe: the server writes to the agent's streams (the container log) and holds them.
    with open(tmp_path / "agent.log", "w") as log:
        code = subprocess.run([sys.executable, "-c", AGENT], env=env, stdout=log, timeout=120).returncode
    (server_line, worker_line) = (tmp_path / "agent.log").read_text().splitlines()
    preloaded, parent = facts(worker_line)
    assert code == 5 and preloaded
    assert parent == int(server_line.split()[1]), "the worker was forked by the server the agent started"
    assert wait_gone(parent), "that server leaves with its agent"


def test_a_prestarted_server_reports_ready_once_it_imported_torch_and_a_second_prestart_starts_none(monkeypatch, tmp_path):
    from ddpjob_trainer import zygote

    monkeypatch.setenv("DDPJOB_ZYGOTE_SOCKET", str(tmp_path / "zygote" / "socket"))
    monkeypatch.setenv("DDPJOB_ZYGOTE_TOKEN", secrets.token_hex(32))  # else prestart would leave its token in this process
    first = zygote.prestart()
    try:
        assert first.wait(timeout=120) is True
        assert zygote.prestart() is None  # the name is served already: no second server starts
    finally:
        first.process.kill()
        first.process.wait()


def test_once_prestart_returns_its_socket_is_served_so_a_worker_never_starts_a_second_server(monkeypatch, tmp_path):
    """On a loaded node the server's interpreter may come up long after prestart returns; a
    worker started meanwhile must find the socket listening (its connection waits in the
    backlog for this server), never start a server of its own."""
    from ddpjob_trainer import zygote

    path = tmp_path / "zygote" / "socket"
    monkeypatch.setenv("DDPJOB_ZYGOTE_SOCKET", str(path))
    monkeypatch.setenv("DDPJOB_ZYGOTE_TOKEN", secrets.token_hex(32))
    warm = zygote.prestart()
    try:
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.connect(str(path))  # refused (or no file) when prestart left the binding to the server
        probe.close()
        assert zygote.Server.claim(str(path), "token") is None, "the directory's lock is held for the server"
        assert warm.wait(timeout=120) is True, "the server serves the socket prestart claimed"
    finally:
        warm.process.kill()
        warm.process.wait()


def test_a_socket_path_longer_than_a_socket_address_holds_is_served_too(tmp_path):
    # The sandbox maps a pod's emptyDir to a deep per-pod directory: sun_path holds 107 bytes.
    (tmp_path / "zy_worker.py").write_text(WORKER)
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    env = {**os.environ, "DDPJOB_ZYGOTE_SOCKET": str(deep / "zygote" / "socket"),
           "DDPJOB_ZYGOTE_TOKEN": secrets.token_hex(32),
           "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    assert len(env["DDPJOB_ZYGOTE_SOCKET"]) > 107
    # Files, not pipes: the server holds the agent's streams until it leaves.
    with open(tmp_path / "out", "w") as out, open(tmp_path / "err", "w") as err:
        code = subprocess.run(["sh", "-c", f"{sys.executable} -m ddpjob_trainer.zygote zy_worker 4; exit $?"],
                              env=env, stdout=out, stderr=err, timeout=120).returncode
    preloaded, server = facts((tmp_path / "out").read_text())
    assert (code, preloaded, (tmp_path / "err").read_text()) == (4, True, ""), "forked by the server, no fallback"
    assert wait_gone(server), "the server leaves with its agent"


# What torchrun's agent does first, whatever its --rdzv_backend (torch's etcd too, which has no
# prestart): import torch's rendezvous package, which calls every torchrun.handlers entry point.
AGENT_IMPORT = """
import os
import torch.distributed.elastic.rendezvous  # noqa: F401
print(len(os.environ.get("DDPJOB_ZYGOTE_TOKEN", "")))
"""


@pytest.mark.parametrize(("socket_set", "token_length"), [(True, 64), (False, 0)])
def test_every_agent_of_a_node_with_a_fork_server_makes_its_token_before_its_workers(tmp_path, socket_set,
                                                                                     token_length):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDPJOB_ZYGOTE_")}
    if socket_set:
        env["DDPJOB_ZYGOTE_SOCKET"] = str(tmp_path / "zygote" / "socket")
    printed = subprocess.run([sys.executable, "-c", AGENT_IMPORT], env=env, capture_output=True, text=True,
                             timeout=120).stdout
    assert int(printed) == token_length  # in its environment: the workers torchrun starts inherit it
