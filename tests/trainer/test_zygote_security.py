"""The node's fork server (ddpjob_trainer.zygote) as a hostile local user tries it.

Whoever gets a request through runs code as the server's user (root here), so: another uid
must not get one through, nor a process without the agent's token; a client that sends
nothing, half a request, garbage, the wrong descriptors or too much must not stop the
server (every worker of the node would go with it); and the socket's directory must be the
server's own. A request that would run writes a marker file; a refused one must not.
Another user is uid 1001 through setpriv (these tests run as root, as the server under attack).
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from ddpjob_trainer.zygote_checks import MAX_REQUEST_BYTES, RECEIVE_SECONDS

OTHER_UID = 1001
pytestmark = pytest.mark.skipif(os.getuid() != 0 or shutil.which("setpriv") is None,
                                reason="acts as a second user: needs root and setpriv")

# The module a request runs: writes its parent's pid (the server's, when forked) to argv[1].
TOUCH = """
import os, sys
with open(sys.argv[1], "w") as out:
    out.write(str(os.getppid()))
"""

# A raw client, run as whichever user: sends one request for zy_touch MARKER and prints the reply.
RAW_CLIENT = r"""
import json, os, socket, sys
path, token, marker = sys.argv[1:4]
conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    conn.connect(path)
except OSError as e:
    sys.exit(print("connect failed:", type(e).__name__))
life, _ = os.pipe()
request = {"module": "zy_touch", "args": [marker], "env": {}, "cwd": "/", "token": token}
try:
    socket.send_fds(conn, [json.dumps(request).encode() + b"\n"], [0, 1, 2, life])
except BrokenPipeError:  # refused at once: the reply may still be there to read
    pass
conn.settimeout(30)
print("reply:", conn.makefile().readline().strip())
"""


@dataclass
class Served:
    path: Path  # the socket
    token: str
    env: dict[str, str]  # a worker's: the socket, the token, zy_touch importable
    pid: int
    log: Path  # the server's stderr


def start(base: Path, token: str, user: list[str] = ()) -> tuple[subprocess.Popen, Served]:
    """A server for agent = this process (it outlives every test), ready (torch imported)."""
    (base / "zy_touch.py").write_text(TOUCH)
    path = base / "zygote" / "socket"
    env = {**os.environ, "DDPJOB_ZYGOTE_SOCKET": str(path), "DDPJOB_ZYGOTE_TOKEN": token,
           "PYTHONPATH": f"{base}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    ready_read, ready_write = os.pipe()
    with open(base / "server.log", "w") as log:
        process = subprocess.Popen([*user, sys.executable, "-m", "ddpjob_trainer.zygote", "--serve", str(path),
                                    str(os.getpid()), str(ready_write)], env=env, stderr=log,
                                   pass_fds=(ready_write,), start_new_session=True)
    os.close(ready_write)
    readable, _, _ = select.select([ready_read], [], [], 180)
    ready = bool(readable) and os.read(ready_read, 1) == b"1"
    os.close(ready_read)
    if not ready:
        stop(process)
    assert ready, (base / "server.log").read_text()
    return process, Served(path, token, env, process.pid, base / "server.log")


def stop(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, 9)
    process.wait(timeout=30)


def open_base(prefix: str) -> Path:
    """A directory every user may pass through (pytest's own is root's, 0700): only the
    server's directory inside may stand in another user's way."""
    base = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(base, 0o755)
    return base


@pytest.fixture(scope="module")
def served():
    base = open_base("zygote-security-")
    try:
        process, served = start(base, secrets.token_hex(32))
        try:
            yield served
        finally:
            stop(process)
    finally:
        shutil.rmtree(base)


def run_client(served: Served, marker: Path) -> int:
    """A worker as torchrun starts it (python -m ddpjob_trainer.zygote zy_touch MARKER)."""
    argv = [sys.executable, "-m", "ddpjob_trainer.zygote", "zy_touch", str(marker)]
    return subprocess.run(argv, env=served.env, timeout=120).returncode


def assert_still_serving(served: Served, tmp_path: Path) -> None:
    """A correct request runs in a worker forked by the same server (a client whose server died
    would start a new one: the worker's parent tells them apart)."""
    marker = tmp_path / "served"
    assert run_client(served, marker) == 0
    assert int(marker.read_text()) == served.pid, "the worker was forked by the server under test"


def raw(served: Served, token: str, marker: Path, user: list[str] = ()) -> str:
    """RAW_CLIENT's output, run as `user` (this process's by default)."""
    done = subprocess.run([*user, sys.executable, "-c", RAW_CLIENT, str(served.path), token, str(marker)],
                          capture_output=True, text=True, timeout=60)
    return done.stdout.strip() + done.stderr.strip()


AS_OTHER_USER = ["setpriv", f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", "--clear-groups"]


def test_another_user_cannot_reach_the_socket_even_with_the_token(served, tmp_path):
    marker = tmp_path / "hostile"
    assert raw(served, served.token, marker, AS_OTHER_USER) == "connect failed: PermissionError"
    assert_still_serving(served, tmp_path)
    assert not marker.exists()


def test_a_connection_from_another_uid_is_refused_where_it_reaches_the_socket(tmp_path):
    # Root passes any directory's mode: the server, as uid 1001, must check its peer itself.
    base = open_base("zygote-peer-")
    try:
        os.chown(base, OTHER_UID, OTHER_UID)
        process, served = start(base, secrets.token_hex(32), AS_OTHER_USER)
        try:
            marker = base / "hostile"
            assert raw(served, served.token, marker) == "reply: " + json.dumps({"error": (
                f"the fork server's client runs as uid 0, not as this process's uid {OTHER_UID}; "
                "only the same user may use it")})
            time.sleep(0.5)
            assert not marker.exists()
        finally:
            stop(process)
    finally:
        shutil.rmtree(base)


TOKEN_REFUSED = ("the request's token is {}: only a worker of this node's agent "
                 "(DDPJOB_ZYGOTE_TOKEN in its environment) may use the fork server")


@pytest.mark.parametrize(("token", "why"), [("", "missing"), ("0" * 64, "wrong"), ("\u00e9" * 64, "wrong")])
def test_a_request_without_the_agents_token_is_refused_and_nothing_runs(served, tmp_path, token, why):
    marker = tmp_path / "hostile"
    assert raw(served, token, marker) == "reply: " + json.dumps({"error": TOKEN_REFUSED.format(why)})
    assert_still_serving(served, tmp_path)
    assert not marker.exists()


def test_a_silent_client_neither_blocks_the_server_nor_stays_forever(served, tmp_path):
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.connect(str(served.path))
    started = time.monotonic()
    assert_still_serving(served, tmp_path)  # while the silent client is connected
    silent.settimeout(RECEIVE_SECONDS + 20)
    reply = silent.makefile().readline()
    assert json.loads(reply) == {"error": f"no complete request within {RECEIVE_SECONDS:g} s"}
    assert time.monotonic() - started < RECEIVE_SECONDS + 5
    silent.close()


def request_line(served: Served, **changes) -> bytes:
    request = {"module": "zy_touch", "args": ["/nonexistent/never"], "env": {}, "cwd": "/", "token": served.token}
    return json.dumps({**request, **changes}).encode() + b"\n"


def send(served: Served, data: bytes, fds: int, close: bool = False) -> str:
    """Sends `data` with `fds` descriptors (a pipe's read end repeated); the reply, or "" if none."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(str(served.path))
    life, life_write = os.pipe()
    try:
        with contextlib.suppress(OSError):  # the server may stop reading a huge request and close
            sent = socket.send_fds(conn, [data], [life] * fds) if fds else 0
            conn.sendall(data[sent:])
        if close:
            conn.close()
            return ""
        conn.settimeout(30)
        return conn.makefile().readline().strip()
    finally:
        conn.close()
        os.close(life)
        os.close(life_write)


BAD_CLIENTS = {
    "disconnects mid-request": (lambda s: send(s, request_line(s)[:20], 4, close=True), ""),
    "malformed JSON": (lambda s: send(s, b'{"module": \n', 4),
                       "the request is not JSON (Expecting value: line 1 column 12 (char 11))"),
    "a JSON list": (lambda s: send(s, b"[1, 2]\n", 4), "the request is a JSON list; it must be an object"),
    "too many descriptors": (lambda s: send(s, request_line(s), 9),
                             "a request carries more than 4 file descriptors; it must carry exactly 4 "
                             "(stdin, stdout, stderr, the client's life pipe)"),
    "no descriptors": (lambda s: send(s, request_line(s), 0),
                       "the request carries 0 file descriptors; it must carry exactly 4"),
    "args not a list": (lambda s: send(s, request_line(s, args="rm -rf"), 4),
                        "the request's args ('rm -rf') must be a list of strings"),
    "a relative cwd": (lambda s: send(s, request_line(s, cwd="x"), 4),
                       "the request's cwd ('x') must be an absolute path"),
    "too much": (lambda s: send(s, b"x" * (2 * MAX_REQUEST_BYTES), 4), None),
}


@pytest.mark.parametrize("name", BAD_CLIENTS)
def test_one_bad_client_never_stops_the_server(served, tmp_path, name):
    act, expected = BAD_CLIENTS[name]
    reply = act(served)
    if expected is not None:
        assert reply == ("" if not expected else json.dumps({"error": expected}))
    assert_still_serving(served, tmp_path)
    assert not Path("/nonexistent/never").exists()


def test_a_request_over_the_bound_is_refused_by_size(served, tmp_path):
    send(served, b"x" * (2 * MAX_REQUEST_BYTES), 4)
    assert f"refused a request: the request is over {MAX_REQUEST_BYTES} bytes" in served.log.read_text()


def test_the_sockets_directory_is_the_servers_own_and_mode_0700(served):
    directory = os.lstat(served.path.parent)
    assert (oct(directory.st_mode & 0o777), directory.st_uid) == ("0o700", os.getuid())
    assert oct(os.lstat(served.path).st_mode & 0o777) == "0o600"


def other_users_dir(path: Path) -> None:
    path.mkdir(mode=0o700)
    os.chown(path, OTHER_UID, OTHER_UID)


def open_dir(path: Path) -> None:
    path.mkdir()
    os.chmod(path, 0o755)


def link_to_own_dir(path: Path) -> None:
    (path.parent / "elsewhere").mkdir(mode=0o700)
    path.symlink_to(path.parent / "elsewhere")


WHERE = "the fork server's directory {} (the parent of DDPJOB_ZYGOTE_SOCKET)"


@pytest.mark.parametrize(("make", "problem"), [
    (other_users_dir, f"belongs to uid {OTHER_UID}, not to this process's uid 0: another user created it first; "
                      "remove it"),
    (open_dir, "has mode 0755; it must be 0700 (only its owner may reach the socket): remove it"),
    (link_to_own_dir, "is a symbolic link; it must be a directory this user created: remove it"),
])
def test_a_directory_made_before_the_server_is_refused_unless_its_own_and_0700(tmp_path, make, problem):
    (tmp_path / "zy_touch.py").write_text(TOUCH)
    directory = tmp_path / "zygote"
    make(directory)
    env = {**os.environ, "DDPJOB_ZYGOTE_SOCKET": str(directory / "socket"), "DDPJOB_ZYGOTE_TOKEN": "t" * 64,
           "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    server = subprocess.run([sys.executable, "-m", "ddpjob_trainer.zygote", "--serve", str(directory / "socket"),
                             str(os.getpid())], env=env, capture_output=True, text=True, timeout=60)
    message = f"{WHERE.format(directory)} {problem}"
    assert (server.returncode, server.stderr) == (
        1, f"ddpjob_trainer.zygote: the fork server does not start: {message}\n")
    # A worker does not use what is there: it says why and runs its module itself.
    marker = tmp_path / "ran"
    client = subprocess.run([sys.executable, "-m", "ddpjob_trainer.zygote", "zy_touch", str(marker)], env=env,
                            capture_output=True, text=True, timeout=60)
    assert client.returncode == 0 and int(marker.read_text()) == os.getpid(), "ran in the client, not forked"
    assert client.stderr == (f"ddpjob_trainer.zygote: not using the fork server: {message}; "
                             "running zy_touch in this process\n")
    assert not (directory / "socket").exists()


def test_an_abstract_socket_name_is_not_used(tmp_path):
    # An operator from before this change renders "@ddpjob-zygote-..."; any local user could connect to it.
    (tmp_path / "zy_touch.py").write_text(TOUCH)
    env = {**os.environ, "DDPJOB_ZYGOTE_SOCKET": "@ddpjob-zygote-old", "DDPJOB_ZYGOTE_TOKEN": "t" * 64,
           "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    marker = tmp_path / "ran"
    client = subprocess.run([sys.executable, "-m", "ddpjob_trainer.zygote", "zy_touch", str(marker)], env=env,
                            capture_output=True, text=True, timeout=60)
    assert client.returncode == 0 and int(marker.read_text()) == os.getpid(), "ran in the client, not forked"
    assert client.stderr == ("ddpjob_trainer.zygote: not using the fork server: DDPJOB_ZYGOTE_SOCKET "
                             "('@ddpjob-zygote-old') must be the absolute path of a socket file (an abstract "
                             "name, \"@...\", is open to every local user); running zy_touch in this process\n")
