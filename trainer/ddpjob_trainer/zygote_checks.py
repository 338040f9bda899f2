"""Who may ask a node's fork server (:mod:`ddpjob_trainer.zygote`) for a worker, and what a request may hold.

The server forks whatever module, arguments, environment and working directory a request
names, as the user it runs as: whoever can send it a request runs code as that user. An
abstract socket name (the first design) has no permissions and is listed to every user in
/proc/net/unix, so every local user, and every container of a pod, could. Now a request passes:

1. the directory: the socket is a file in a directory of the server's user, mode 0700, that the
   server made (or made earlier: a node whose agent restarted); one of another user, with another
   mode, or a symbolic link is refused. Only that user can reach the socket; in a pod the
   directory lies in an emptyDir only the trainer container mounts.
2. the peer's credentials (SO_PEERCRED): the connecting process runs as the server's uid (root,
   which passes any directory's mode, included). The client checks the server's the same way
   before it hands over its environment and streams.
3. the agent's token: a random secret the torchrun agent makes once (``agent_token``) and hands
   its workers, and through them the server, in the environment, which only its own user (and
   root) can read in /proc; never in argv, which every user can read.
4. the request itself: at most MAX_REQUEST_BYTES within RECEIVE_SECONDS, exactly the client's
   four streams as file descriptors, and JSON of the expected shape.
"""
from __future__ import annotations

import hmac
import json
import os
import secrets
import socket
import stat
import struct

from ddpjob_rdzv.contract import ZYGOTE_TOKEN_ENV

MAX_REQUEST_BYTES = 1 << 20  # a worker's environment is a few KiB; 1 MiB is far above any real one
RECEIVE_SECONDS = 10.0  # a client sends its request at once; one that does not is dropped after this
STREAMS = 4  # stdin, stdout, stderr and the client's life pipe, in that order
DIR_MODE = 0o700
SUN_PATH_MAX = 107  # the longest socket path: sun_path holds 108 bytes with the terminating NUL (unix(7))


class RefusedError(Exception):
    """A socket directory, a peer or a request the fork server (or its client) will not use; says why."""


def agent_token() -> str:
    """This agent's token, made once (secrets.token_hex) and put in os.environ, which torchrun
    copies into each worker it starts; a token the agent inherited (the tests' stand-in agents) is kept."""
    token = os.environ.get(ZYGOTE_TOKEN_ENV)
    if not token:
        token = os.environ[ZYGOTE_TOKEN_ENV] = secrets.token_hex(32)
    return token


def make_private_dir(path: str) -> None:
    """Creates the socket's directory ``path`` (mode 0700), or accepts one this user made before.

    Raises:
        RefusedError: it exists and is not a directory of this user with mode 0700 (see
            check_private_dir), or its parent does not exist.
    """
    try:
        os.mkdir(path, DIR_MODE)
        os.chmod(path, DIR_MODE)  # mkdir's mode passes through the umask
    except FileExistsError:
        pass
    except FileNotFoundError:
        raise RefusedError(f"cannot create the fork server's directory {path}: its parent does not exist") from None
    check_private_dir(path)


def check_private_dir(path: str) -> None:
    """Raises RefusedError unless ``path`` is a directory (not a link to one) of this user, mode 0700.

    Raises:
        FileNotFoundError: it does not exist (yet).
    """
    info = os.lstat(path)
    where = f"the fork server's directory {path} (the parent of DDPJOB_ZYGOTE_SOCKET)"
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise RefusedError(f"{where} is {'a symbolic link' if stat.S_ISLNK(info.st_mode) else 'not a directory'}; "
                           "it must be a directory this user created: remove it")
    if info.st_uid != os.getuid():
        raise RefusedError(f"{where} belongs to uid {info.st_uid}, not to this process's uid {os.getuid()}: "
                           "another user created it first; remove it")
    if stat.S_IMODE(info.st_mode) != DIR_MODE:
        raise RefusedError(f"{where} has mode {stat.S_IMODE(info.st_mode):04o}; it must be 0700 "
                           "(only its owner may reach the socket): remove it")


def open_dir(path: str) -> int:
    """A descriptor of directory ``path`` (not of a link to one), for flock and socket_address."""
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)


def socket_address(path: str, dir_fd: int) -> str:
    """Where to bind or connect for socket file ``path`` in the directory open as ``dir_fd``:
    ``path`` itself, or, when longer than a socket address holds (the sandbox's per-pod
    directories are deep), the same file reached through /proc/self/fd."""
    if len(path.encode()) <= SUN_PATH_MAX:
        return path
    return f"/proc/self/fd/{dir_fd}/{os.path.basename(path)}"


def check_peer(conn: socket.socket, side: str) -> None:
    """Raises RefusedError unless the process at the other end of ``conn`` runs as this uid.

    Args:
        side: who the peer is, for the message ("client", "server").
    """
    _, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    if uid != os.getuid():
        raise RefusedError(f"the fork server's {side} runs as uid {uid}, not as this process's uid {os.getuid()}; "
                           "only the same user may use it")


class RequestReader:
    """One client's request as it arrives on a non-blocking connection: bounded in bytes and
    descriptors; ``read`` once the connection is readable, until it returns the request line."""

    def __init__(self, conn: socket.socket, deadline: float) -> None:
        self.conn, self.deadline = conn, deadline
        self.data, self.fds = bytearray(), []

    def read(self) -> bytes | None:
        """The request line once complete, else None (more to come).

        Raises:
            RefusedError: the client closed early, sent too much, or too many descriptors.
        """
        try:
            data, fds, flags, _ = socket.recv_fds(self.conn, 1 << 16, STREAMS + 1)
        except BlockingIOError:
            return None
        except OSError as e:
            raise RefusedError(f"the client's connection failed: {e}") from None
        self.fds += fds
        if flags & socket.MSG_CTRUNC or len(self.fds) > STREAMS:
            raise RefusedError(f"a request carries more than {STREAMS} file descriptors; it must carry exactly "
                               f"{STREAMS} (stdin, stdout, stderr, the client's life pipe)")
        if not data:
            raise RefusedError("the client closed the connection before its request ended (a newline)")
        self.data += data
        line, newline, _ = bytes(self.data).partition(b"\n")
        if len(line) > MAX_REQUEST_BYTES:
            raise RefusedError(f"the request is over {MAX_REQUEST_BYTES} bytes")
        return line if newline else None

    def close_fds(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []


def parse_request(line: bytes, fds: list[int], token: str) -> dict:
    """The request ``line`` sent with ``fds``, if it holds ``token`` and has the expected shape.

    Raises:
        RefusedError: naming the first thing wrong.
    """
    try:
        request = json.loads(line)
    except (UnicodeDecodeError, ValueError) as e:
        raise RefusedError(f"the request is not JSON ({e})") from None
    if not isinstance(request, dict):
        raise RefusedError(f"the request is a JSON {type(request).__name__}; it must be an object")
    given = request.get("token")
    if not isinstance(given, str) or not hmac.compare_digest(given.encode(), token.encode()):
        raise RefusedError(f"the request's token is {'wrong' if given else 'missing'}: only a worker of this "
                           f"node's agent ({ZYGOTE_TOKEN_ENV} in its environment) may use the fork server")
    _check_shape(request)
    if len(fds) != STREAMS:
        raise RefusedError(f"the request carries {len(fds)} file descriptors; it must carry exactly {STREAMS}")
    return request


def _check_shape(request: dict) -> None:
    def strings(value) -> bool:
        return all(isinstance(item, str) for item in value)

    checks = {"module": lambda v: isinstance(v, str) and v != "",
              "args": lambda v: isinstance(v, list) and strings(v),
              "env": lambda v: isinstance(v, dict) and strings(v) and strings(v.values()),
              "cwd": lambda v: isinstance(v, str) and os.path.isabs(v)}
    rules = {"module": "a module name", "args": "a list of strings", "env": "an object of strings",
             "cwd": "an absolute path"}
    for key, check in checks.items():
        if not check(request.get(key)):
            raise RefusedError(f"the request's {key} ({str(request.get(key))[:80]!r}) must be {rules[key]}")
