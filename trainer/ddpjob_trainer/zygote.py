"""Workers that start without importing torch again: a per-node fork server for torchrun.

torchrun starts every worker as a fresh ``python -m MODULE``, and importing torch took
5-6 s of a ~20 s node-loss recovery here (bench/recovery.py), paid again on each restart.
With ``python -m ddpjob_trainer.zygote MODULE ARGS...`` as the worker and
DDPJOB_ZYGOTE_SOCKET naming a Unix socket (abstract when it starts with "@"), the first
worker of a node starts a server that imports torch and MODULE once; every worker then
is a small client: it hands the server its environment, working directory, arguments and
standard streams, the server forks the real worker from its warm state, and the client
relays torchrun's signals to it and exits with its status, so torchrun sees an ordinary
worker. A SIGKILLed client takes its worker along (the worker watches a pipe only the
client holds open); the server leaves when the torchrun agent that started it is gone.

The server forks from a single thread that has touched neither CUDA nor a process
group: what torch initialises lazily (thread pools, CUDA, gloo) starts in the worker.
Without DDPJOB_ZYGOTE_SOCKET the module runs in this process, as ``python -m MODULE``.
"""
from __future__ import annotations

import contextlib
import importlib
import json
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import threading
import time

from . import marks

SOCKET_ENV = "DDPJOB_ZYGOTE_SOCKET"
AGENT_PID_ENV = "DDPJOB_AGENT_PID"  # in a forked worker: the torchrun agent that started its client
CONNECT_SECONDS = 120.0  # how long a client waits for the server (its first start imports torch)
RELAYED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def address(name: str) -> str:
    """The socket address of DDPJOB_ZYGOTE_SOCKET: "@x" is Linux's abstract name "\\0x"."""
    return "\0" + name[1:] if name.startswith("@") else name


def main(argv: list[str]) -> int:
    if argv[:1] == ["--serve"]:
        return serve(address(argv[1]), int(argv[2]), int(argv[3]) if len(argv) > 3 else None)
    name = os.environ.get(SOCKET_ENV)
    if not name:
        return run_module(argv[0], argv[1:])
    return client(address(name), argv[0], argv[1:])


# -- the client (the process torchrun started) ----------------------------------------

def client(path: str, module: str, args: list[str]) -> int:
    conn = _connect_or_start(path)
    life_read, life_write = os.pipe()  # the worker dies when this process dies (EOF)
    # The forked worker's parent is the server, not torchrun: it learns the agent's pid here
    # (progress_report.stop_agent, which a DoNotRetry uses to stop the agent at once).
    env = {**os.environ, AGENT_PID_ENV: str(os.getppid())}
    request = json.dumps({"module": module, "args": args, "env": env, "cwd": os.getcwd()})
    socket.send_fds(conn, [request.encode() + b"\n"], [0, 1, 2, life_read])
    os.close(life_read)
    reader = conn.makefile("r")
    worker = int(json.loads(reader.readline())["pid"])
    for sig in RELAYED:
        signal.signal(sig, lambda number, _frame: _signal(worker, number))
    line = reader.readline()
    status = json.loads(line) if line else {"code": 1}
    if "signal" in status:
        signal.signal(status["signal"], signal.SIG_DFL)
        os.kill(os.getpid(), status["signal"])
    return int(status.get("code", 1))


def _connect_or_start(path: str) -> socket.socket:
    deadline, started = time.monotonic() + CONNECT_SECONDS, False
    while True:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(path)
            return conn
        except (FileNotFoundError, ConnectionRefusedError):
            conn.close()
            if time.monotonic() > deadline:
                raise
        if not started:  # the parent is the torchrun agent: the server lives as long as it does
            start_server(os.environ[SOCKET_ENV], os.getppid())
            started = True
        time.sleep(0.05)


def start_server(name: str, agent: int, ready_fd: int | None = None) -> subprocess.Popen:
    """Starts the server of socket ``name`` for torchrun agent ``agent`` (it leaves with it); a
    second start for a name already served exits at once. ``ready_fd``, a pipe's write end,
    is written to once the server has imported what it preloads (closed unwritten if it exits)."""
    extra = [str(ready_fd)] if ready_fd is not None else []
    return subprocess.Popen([sys.executable, "-m", "ddpjob_trainer.zygote", "--serve", name, str(agent), *extra],
                            stdin=subprocess.DEVNULL, start_new_session=True,
                            pass_fds=(ready_fd,) if ready_fd is not None else ())


class Warm:
    """A prestarted server: ``wait`` returns once it has imported torch (or is gone)."""

    def __init__(self, process: subprocess.Popen, ready_read: int) -> None:
        self.process, self._ready = process, ready_read

    def wait(self, timeout: float = CONNECT_SECONDS) -> bool:
        """Whether the server reported ready within ``timeout`` (False: timed out, or it exited)."""
        if self._ready < 0:
            return True
        readable, _, _ = select.select([self._ready], [], [], timeout)
        ready = bool(readable) and os.read(self._ready, 1) == b"1"
        if readable:
            os.close(self._ready)
            self._ready = -1
        return ready


def prestart() -> Warm | None:
    """From the torchrun agent (its rendezvous handler): starts the node's server now when
    DDPJOB_ZYGOTE_SOCKET is set, so torch is imported while the agent rendezvouses.

    Otherwise a new node (a replacement) imports torch only once its first worker starts, after
    the round completed, and every node of that round waits for it (3-5 s here). The server
    binds its socket before importing, so a worker that comes sooner waits for it, not for a
    second server. A node joining a running group waits for ``Warm.wait`` before it joins
    (rendezvous/early.py), so the group's pause does not include these imports either.
    """
    name = os.environ.get(SOCKET_ENV)
    if not name:
        return None
    ready_read, ready_write = os.pipe()
    try:
        process = start_server(name, os.getpid(), ready_write)
    finally:
        os.close(ready_write)
    return Warm(process, ready_read)


def _signal(pid: int, number: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, number)


# -- the server ---------------------------------------------------------------------------

def serve(path: str, agent: int, ready_fd: int | None = None) -> int:
    """Forks a worker per client until the torchrun agent ``agent`` is gone and every worker
    reported; writes to ``ready_fd`` once preloaded."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path)
    except OSError:  # another worker of this node started it first
        return 0
    listener.listen(64)
    _preload()
    if ready_fd is not None:
        with contextlib.suppress(OSError):
            os.write(ready_fd, b"1")
        os.close(ready_fd)
    waiting: dict[int, socket.socket] = {}  # worker pid -> its client's connection
    while _alive(agent) or waiting:
        ready, _, _ = select.select([listener], [], [], 0.05)
        if ready:
            conn, _ = listener.accept()
            pid = _fork_worker(conn, [listener, *waiting.values()])
            waiting[pid] = conn
        _report_exits(waiting)
    return 0


# What the server imports before forking: torch, torch._dynamo (the first optimizer imports
# it: 3-6 s here, as long as torch itself) and the trainer library. Not the worker's module:
# a module may train at import (no __main__ guard); runpy runs it in the worker.
PRELOAD = ("torch", "torch._dynamo", "torch.optim", "torch.distributed", "torch.nn.parallel",
           "ddpjob_trainer.trainer", "ddpjob_trainer.dist")


def _preload() -> None:
    for name in PRELOAD:
        with contextlib.suppress(Exception):
            importlib.import_module(name)


def _fork_worker(conn: socket.socket, others: list[socket.socket]) -> int:
    data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 4)
    request = json.loads(data.decode())
    pid = os.fork()
    if pid == 0:  # the worker: nothing of the server's stays open in it
        for sock in (conn, *others):
            sock.close()
        # Unwinds through the server's frames to an ordinary interpreter exit: non-daemon
        # threads (the snapshot writer) are joined and atexit handlers run, as in `python -m`.
        raise SystemExit(_worker(request, fds))
    for fd in fds:
        os.close(fd)
    conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    return pid


def _report_exits(waiting: dict[int, socket.socket]) -> None:
    for pid in list(waiting):
        done, status = os.waitpid(pid, os.WNOHANG)
        if not done:
            continue
        conn = waiting.pop(pid)
        report = ({"signal": os.WTERMSIG(status)} if os.WIFSIGNALED(status)
                  else {"code": os.waitstatus_to_exitcode(status)})
        with contextlib.suppress(OSError):
            conn.sendall(json.dumps(report).encode() + b"\n")
        conn.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# -- the worker (forked) -------------------------------------------------------------------

def _worker(request: dict, fds: list[int]) -> int:
    stdin, stdout, stderr, life = fds
    for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
        os.dup2(fd, target)
        os.close(fd)
    os.setsid()  # its own group, as torchrun gives a worker; the client relays signals to it
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    for sig in RELAYED:
        signal.signal(sig, signal.SIG_DFL)
    for stream in (sys.stdout, sys.stderr):  # as torchrun's `python -u`
        stream.reconfigure(write_through=True)
    threading.Thread(target=_die_with_client, args=(life,), daemon=True).start()
    marks.mark("process_started")
    marks.mark("imports_done")
    return run_module(request["module"], request["args"])


def _die_with_client(life: int) -> None:
    while os.read(life, 1):
        pass
    os.kill(os.getpid(), signal.SIGKILL)


def run_module(module: str, args: list[str]) -> int:
    """Runs ``module`` as ``python -m module args`` would; its exit code."""
    sys.argv = [module, *args]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exit_:
        code = exit_.code
        return code if isinstance(code, int) else (0 if code is None else (print(code, file=sys.stderr) or 1))
    except BaseException:
        import traceback

        traceback.print_exc()
        return 1
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
