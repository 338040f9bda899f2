"""Workers that start without importing torch again: a per-node fork server for torchrun.

torchrun starts every worker as a fresh ``python -m MODULE``, and importing torch took
5-6 s of a ~20 s node-loss recovery here (bench/recovery.py), paid again on each restart.
With ``python -m ddpjob_trainer.zygote MODULE ARGS...`` as the worker and
DDPJOB_ZYGOTE_SOCKET naming a socket file, the first worker of a node starts a server that
imports torch and MODULE once; every worker then is a small client: it hands the server its
environment, working directory, arguments and standard streams, the server forks the real
worker from its warm state, and the client relays torchrun's signals to it and exits with
its status, so torchrun sees an ordinary worker. A SIGKILLed client takes its worker along
(the worker watches a pipe only the client holds open); the server leaves when the torchrun
agent that started it is gone.

Whoever may send the server a request runs code as its user, so only the agent's own
workers may: the socket lies in a 0700 directory of the agent's user, both ends check the
other's uid, and each request carries the agent's token (see :mod:`.zygote_checks`). A
client that cannot use the server safely says why on stderr and runs MODULE itself, as
without DDPJOB_ZYGOTE_SOCKET: the job loses the warm start, never its workers.

The server forks from a single thread that has touched neither CUDA nor a process
group: what torch initialises lazily (thread pools, CUDA, gloo) starts in the worker.
Without DDPJOB_ZYGOTE_SOCKET the module runs in this process, as ``python -m MODULE``.
"""
from __future__ import annotations

import contextlib
import fcntl
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
import traceback
from dataclasses import dataclass
from typing import TextIO

from ddpjob_rdzv.contract import ZYGOTE_SOCKET_ENV, ZYGOTE_TOKEN_ENV

from . import marks
from .zygote_checks import (
    MAX_REQUEST_BYTES, RECEIVE_SECONDS, RefusedError, RequestReader, agent_token, check_peer,
    check_private_dir, make_private_dir, open_dir, parse_request, socket_address,
)

AGENT_PID_ENV = "DDPJOB_AGENT_PID"  # in a forked worker: the torchrun agent that started its client
CONNECT_SECONDS = 120.0  # how long a client waits for the server (its first start imports torch)
MAX_PENDING = 64  # connections whose request is still arriving; more are refused at once
RELAYED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--serve"]:  # --serve PATH AGENT [READY_FD [LISTEN_FD LOCK_FD]]
        fds = [int(fd) for fd in argv[3:6]] + [None, None, None]
        return serve(argv[1], int(argv[2]), fds[0], Held(fds[1], fds[2]) if fds[1] is not None else None)
    path = os.environ.get(ZYGOTE_SOCKET_ENV)
    if not path:
        return run_module(argv[0], argv[1:])
    try:
        return client(path, argv[0], argv[1:])
    except RefusedError as e:  # raised only before a worker was forked
        print(f"ddpjob_trainer.zygote: not using the fork server: {e}; running {argv[0]} in this process",
              file=sys.stderr, flush=True)
        return run_module(argv[0], argv[1:])


def prepare_agent() -> None:
    """In a torchrun agent, before its first worker: makes the token its workers will hand the
    node's fork server (zygote_checks.agent_token), when the node has one.

    torch calls ddpjob-trainer's ``torchrun.handlers`` entry points in every agent, whatever
    its --rdzv_backend (torch's etcd too, whose handler does not prestart a server), so this
    runs in every agent of a fastRestart job.
    """
    if os.environ.get(ZYGOTE_SOCKET_ENV):
        agent_token()


# -- the client (the process torchrun started) ----------------------------------------

def client(path: str, module: str, args: list[str]) -> int:
    """Runs ``module`` in a worker the server forks; its exit status.

    Raises:
        RefusedError: the server cannot be used (nothing was forked).
    """
    reader, worker = _request_worker(path, module, args)
    for sig in RELAYED:
        signal.signal(sig, lambda number, _frame: _signal(worker, number))
    line = reader.readline()
    status = json.loads(line) if line else {"code": 1}
    if "signal" in status:
        signal.signal(status["signal"], signal.SIG_DFL)
        os.kill(os.getpid(), status["signal"])
    return int(status.get("code", 1))


def _request_worker(path: str, module: str, args: list[str]) -> tuple[TextIO, int]:
    """Sends the request; the connection's reader and the forked worker's pid."""
    token = _client_token(path)
    conn = _connect_or_start(path)
    check_peer(conn, "server")  # before our environment and streams go to whoever listens there
    life_read, life_write = os.pipe()  # the worker dies when this process dies (EOF); never closed here
    # The forked worker's parent is the server, not torchrun: it learns the agent's pid here
    # (progress_report.stop_agent, which a DoNotRetry uses to stop the agent at once).
    env = {**os.environ, AGENT_PID_ENV: str(os.getppid())}
    request = json.dumps({"module": module, "args": args, "env": env, "cwd": os.getcwd(), "token": token}).encode()
    if len(request) > MAX_REQUEST_BYTES:
        raise RefusedError(f"the request (environment and arguments) is {len(request)} bytes, "
                           f"over the server's {MAX_REQUEST_BYTES}")
    reader = conn.makefile("r")
    try:
        sent = socket.send_fds(conn, [request + b"\n"], [0, 1, 2, life_read])
        conn.sendall((request + b"\n")[sent:])
        reply = json.loads(reader.readline() or '{"error": "it closed the connection"}')
    except OSError as e:
        raise RefusedError(f"the connection to the fork server failed: {e}") from None
    finally:
        os.close(life_read)
    if "error" in reply:
        raise RefusedError(f"the fork server refused the request: {reply['error']}")
    return reader, int(reply["pid"])


def _client_token(path: str) -> str:
    if not os.path.isabs(path):
        raise RefusedError(f"{ZYGOTE_SOCKET_ENV} ({path!r}) must be the absolute path of a socket file "
                           "(an abstract name, \"@...\", is open to every local user)")
    token = os.environ.get(ZYGOTE_TOKEN_ENV)
    if not token:
        raise RefusedError(f"{ZYGOTE_TOKEN_ENV} is not set: the torchrun agent makes it when ddpjob-trainer is "
                           "installed beside torchrun")
    return token


def _connect_or_start(path: str) -> socket.socket:
    deadline, server = time.monotonic() + CONNECT_SECONDS, None
    while True:
        with contextlib.suppress(FileNotFoundError):  # no directory, no socket: no server yet
            conn = _connect(path)
            if conn is not None:
                return conn
        if server is None:  # the parent is the torchrun agent: the server lives as long as it does
            server = start_server(path, os.getppid())
        elif server.poll():  # 0: another server of this node holds the directory
            raise RefusedError(f"the fork server exited with code {server.returncode} (its message is above)")
        if time.monotonic() > deadline:
            raise RefusedError(f"no fork server answered at {path} within {CONNECT_SECONDS:g} s")
        time.sleep(0.05)


def _connect(path: str) -> socket.socket | None:
    """A connection to the server at ``path``; None for a socket left by a server that was killed.

    Raises:
        FileNotFoundError: no directory or no socket yet.
        RefusedError: the directory is not this user's own (zygote_checks.check_private_dir).
    """
    directory = os.path.dirname(path)
    check_private_dir(directory)
    dir_fd = open_dir(directory)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(socket_address(path, dir_fd))
        return conn
    except ConnectionRefusedError:
        conn.close()
        return None
    except BaseException:
        conn.close()
        raise
    finally:
        os.close(dir_fd)


@dataclass(frozen=True)
class Held:
    """A server's listening socket and directory lock, claimed by one process for another."""

    listen_fd: int
    lock_fd: int


def start_server(path: str, agent: int, ready_fd: int | None = None, held: Held | None = None) -> subprocess.Popen:
    """Starts the server of socket ``path`` for torchrun agent ``agent`` (it leaves with it); a
    second start for a socket already served exits at once. ``ready_fd``, a pipe's write end,
    is written to once the server has imported what it preloads (closed unwritten if it exits).
    ``held``: the socket and lock already claimed (prestart), which the server serves instead of
    claiming its own; requires ``ready_fd``. The server reads the agent's token from its
    environment (this process's)."""
    fds = [fd for fd in (ready_fd, *((held.listen_fd, held.lock_fd) if held else ())) if fd is not None]
    return subprocess.Popen([sys.executable, "-m", "ddpjob_trainer.zygote", "--serve", path, str(agent),
                             *map(str, fds)], stdin=subprocess.DEVNULL, start_new_session=True, pass_fds=tuple(fds))


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
    path = os.environ.get(ZYGOTE_SOCKET_ENV)
    if not path:
        return None
    token = agent_token()  # in os.environ: the server and the workers torchrun starts inherit it
    # Claimed here, before this returns, and handed to the server: claimed by the server itself,
    # a worker started before the server's interpreter came up (on a loaded node) found nobody
    # listening, started a second server, and that one served it.
    try:
        claimed = Server.claim(path, token)
    except RefusedError as e:  # the workers then run without it, each saying why
        print(f"ddpjob_trainer.zygote: the fork server does not start: {e}", file=sys.stderr, flush=True)
        return None
    if claimed is None:  # this node's server runs already
        return None
    ready_read, ready_write = os.pipe()
    try:
        process = start_server(path, os.getpid(), ready_write, Held(claimed.listener.fileno(), claimed.lock))
    finally:
        os.close(ready_write)
        claimed.listener.close()  # the server holds both now; a copy here would accept nobody's connection
        os.close(claimed.lock)
    return Warm(process, ready_read)


def _signal(pid: int, number: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, number)


# -- the server ---------------------------------------------------------------------------

def serve(path: str, agent: int, ready_fd: int | None = None, held: Held | None = None) -> int:
    """Forks a worker per accepted request until the torchrun agent ``agent`` is gone and every
    worker reported; writes to ``ready_fd`` once preloaded. ``held``: the socket and lock its
    starter claimed. 1: it cannot serve ``path`` safely."""
    try:
        token = os.environ.get(ZYGOTE_TOKEN_ENV, "")
        server = Server.claim(path, token) if held is None else Server.adopt(path, held, token)
    except RefusedError as e:
        print(f"ddpjob_trainer.zygote: the fork server does not start: {e}", file=sys.stderr, flush=True)
        return 1
    if server is None:  # another worker of this node started it first
        return 0
    _preload()
    if ready_fd is not None:
        with contextlib.suppress(OSError):
            os.write(ready_fd, b"1")
        os.close(ready_fd)
    server.run(agent)
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


class Server:
    """The listening socket, the directory lock and the connections of one node's server.

    One thread serves every client: a request is read piece by piece as it arrives, so a
    client that sends nothing, too much or garbage is refused (or dropped at its deadline)
    while the others are served.
    """

    def __init__(self, path: str, listener: socket.socket, lock: int, token: str) -> None:
        self.path, self.listener, self.lock, self.token = path, listener, lock, token
        self.pending: dict[socket.socket, RequestReader] = {}  # requests still arriving
        self.waiting: dict[int, socket.socket] = {}  # worker pid -> its client's connection

    @classmethod
    def claim(cls, path: str, token: str) -> Server | None:
        """The server of ``path``, or None when another holds its directory (flock).

        Raises:
            RefusedError: no token, an unsafe directory (zygote_checks), or a socket it cannot bind.
        """
        if not token:
            raise RefusedError(f"{ZYGOTE_TOKEN_ENV} is not set: the agent that starts the server makes it")
        directory = os.path.dirname(path)
        make_private_dir(directory)
        lock = open_dir(directory)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock)
            return None
        try:
            return cls(path, _listen(path, lock), lock, token)
        except OSError as e:
            os.close(lock)
            raise RefusedError(f"cannot listen at {path}: {e}") from None

    @classmethod
    def adopt(cls, path: str, held: Held, token: str) -> Server:
        """The server of ``path`` from a socket and lock another process claimed for it."""
        if not token:
            raise RefusedError(f"{ZYGOTE_TOKEN_ENV} is not set: the agent that starts the server makes it")
        return cls(path, socket.socket(fileno=held.listen_fd), held.lock_fd, token)

    def run(self, agent: int) -> None:
        while self.listener or self.pending or self.waiting:
            if self.listener and not _alive(agent):
                self._stop_listening()
            watched = [self.listener, *self.pending] if self.listener else list(self.pending)
            ready, _, _ = select.select(watched, [], [], 0.05)
            for sock in ready:
                try:
                    if sock is self.listener:
                        self._accept()
                    else:
                        self._receive(sock)
                except Exception:  # a bug must cost one request, never every worker of the node
                    traceback.print_exc()
                    if sock in self.pending:
                        self._refuse(sock, RefusedError("the server failed reading it"))
            self._drop_expired()
            self._report_exits()

    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        try:
            check_peer(conn, "client")
            if len(self.pending) >= MAX_PENDING:
                raise RefusedError(f"{MAX_PENDING} other requests are still arriving")
        except RefusedError as e:
            self._refuse(conn, e)
            return
        conn.setblocking(False)
        self.pending[conn] = RequestReader(conn, time.monotonic() + RECEIVE_SECONDS)

    def _receive(self, conn: socket.socket) -> None:
        reader = self.pending[conn]
        try:
            line = reader.read()
            if line is None:
                return
            request = parse_request(line, reader.fds, self.token)
        except RefusedError as e:
            self._refuse(conn, e)
            return
        del self.pending[conn]
        conn.setblocking(True)
        try:
            pid = os.fork()
        except OSError as e:
            reader.close_fds()
            self._refuse(conn, RefusedError(f"fork failed: {e}"))
            return
        if pid == 0:
            self._become_worker(conn, request, reader.fds)
        reader.close_fds()
        with contextlib.suppress(OSError):
            conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        self.waiting[pid] = conn

    def _become_worker(self, conn: socket.socket, request: dict, fds: list[int]) -> None:
        """In the forked child: nothing of the server's stays open; never returns."""
        code = 1
        try:
            for other in self.pending.values():  # other clients' streams
                other.close_fds()
            for sock in (conn, *self.pending, *self.waiting.values()):
                sock.close()
            self._stop_listening(unlink=False)
            code = _worker(request, fds)
        except BaseException:
            traceback.print_exc()
        # Unwinds through the server's frames to an ordinary interpreter exit: non-daemon
        # threads (the snapshot writer) are joined and atexit handlers run, as in `python -m`.
        raise SystemExit(code)

    def _refuse(self, conn: socket.socket, error: RefusedError) -> None:
        """Tells the client why (when it still listens), logs it, and drops the connection."""
        print(f"ddpjob_trainer.zygote: refused a request: {error}", file=sys.stderr, flush=True)
        reader = self.pending.pop(conn, None)
        if reader is not None:
            reader.close_fds()
        with contextlib.suppress(OSError):
            conn.setblocking(True)
            conn.settimeout(1.0)
            conn.sendall(json.dumps({"error": str(error)}).encode() + b"\n")
        conn.close()

    def _drop_expired(self) -> None:
        now = time.monotonic()
        for conn in [c for c, reader in self.pending.items() if reader.deadline < now]:
            self._refuse(conn, RefusedError(f"no complete request within {RECEIVE_SECONDS:g} s"))

    def _stop_listening(self, unlink: bool = True) -> None:
        """No new clients: the agent is gone, and a new agent's server may take the directory."""
        if self.listener is None:
            return
        if unlink:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        self.listener.close()
        os.close(self.lock)  # releases the flock (a forked worker closed its copy)
        self.listener = None

    def _report_exits(self) -> None:
        for pid in list(self.waiting):
            done, status = os.waitpid(pid, os.WNOHANG)
            if not done:
                continue
            conn = self.waiting.pop(pid)
            report = ({"signal": os.WTERMSIG(status)} if os.WIFSIGNALED(status)
                      else {"code": os.waitstatus_to_exitcode(status)})
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps(report).encode() + b"\n")
            conn.close()


def _listen(path: str, dir_fd: int) -> socket.socket:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # a socket left by a server that was killed (we hold the directory's lock)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(socket_address(path, dir_fd))
        os.chmod(path, 0o600)
        listener.listen(64)
    except OSError:
        listener.close()
        raise
    return listener


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
