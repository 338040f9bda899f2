"""A node's progress record for the operator: written to the termination message and served at GET /progress.

The record (layout and rules: ``ddpjob_rdzv/progress_record.py``, shared with the operator)
says where training stands: the newest complete snapshot, when this run of the workers
started and took its first step, and why training raised. Each node's local-rank-0 worker
keeps it current and publishes it two ways, neither of which gives training pods API rights
(no ServiceAccount token, no RBAC to patch the DDPJob):

* **the termination message**: the kubelet copies the file at ``terminationMessagePath``
  into ``status.containerStatuses[].state.terminated.message`` whenever the container exits
  (crash, kill, success), and the operator already watches its pods. It is seen only once
  the container has exited, and holds at most ``TERMINATION_MESSAGE_BYTES`` (4096);
* **GET /progress** on ``$DDPJOB_PROGRESS_PORT`` (set in rendered pods; the address is
  ``$DDPJOB_LISTEN_HOST``, every interface unless set, ddpjob_trainer/listen.py) while the worker
  runs: the operator polls it (controller/live_progress.py) the way Prometheus reaches pods,
  so a job that has not failed yet shows its progress too. A port that is taken only turns
  the endpoint off, with a warning.

``snapshot`` is ``<snapshot dir>/progress.json``, checked and copied (rank 0 writes it after
each complete snapshot; the other nodes copy it from the shared volume at most every
POLL_SECONDS). ``resume`` lets the operator compute the time to recover (failure ->
firstStepTime) and the time lost per restart (fromSnapshotTime -> firstStepTime). When an
exception escapes training the record gets ``error``, and ``fatal`` too when it is a
:class:`ddpjob_trainer.errors.DoNotRetry`: the operator then fails the job instead of
retrying. ``fatal`` stays for the container's life: workers that torchrun restarts in the
same container keep it.

Writing the message: the kubelet bind-mounts the one file, so the usual temp-file-and-rename
cannot replace it (rename onto a mount point fails with EBUSY, and the directory is not
ours). Instead each record is written with a single ``pwrite`` at offset 0, padded with
spaces to at least the previous length: the file is never truncated, so a worker killed at
any moment leaves the previous or the new record, never an empty or mixed one (JSON ignores
the trailing spaces). The kubelet reads it only after the exit.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import os
import signal
import socket
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ddpjob_rdzv import progress_record
from ddpjob_rdzv.progress_record import MAX_ERROR_CHARS, TERMINATION_MESSAGE_BYTES

from . import zygote
from .errors import DoNotRetry
from .listen import listen_host, listening_socket

log = logging.getLogger(__name__)

ENV_PATH = "DDPJOB_TERMINATION_LOG"  # where to write; rendered into pods with terminationMessagePath
DEFAULT_PATH = "/dev/termination-log"  # Kubernetes' default terminationMessagePath
RECORD_BYTES = 1024  # minimum padded size of the message (the kubelet keeps up to 4096 bytes)
POLL_SECONDS = 5.0  # how often nodes other than rank 0's copy progress.json from the shared volume
PORT_ENV = "DDPJOB_PROGRESS_PORT"  # serve the record at GET /progress on this port (rendered pods set it)
# Whose record it is (rendered pods set both; ddpjob run the uid): the operator refuses a record
# that names another job or pod (decide/progress.py), e.g. one read at a pod IP another pod reused.
IDENTITY_ENV = {"jobUID": "DDPJOB_JOB_UID", "pod": "DDPJOB_POD_NAME"}
HTTP_PATH = "/progress"
READ_TIMEOUT_SECONDS = 2.0  # a client of /progress has this long to send its request and read the answer
MAX_CONNECTIONS = 8  # open /progress connections; a new one beyond closes the oldest
MAX_REQUEST_BYTES = 8192  # request line and headers; a GET needs ~100
HEARTBEAT_PREFIX = "ddpjob/heartbeat/"  # + rank: each rank's heartbeat key in the process group's store
HEARTBEAT_SECONDS = 1.0  # each rank writes its heartbeat, and each reporter gathers them, this often
GATHER_RANKS = 64  # above this many ranks, reporters gather less often (every node reads every key)
MAX_BEAT_BYTES = 4096  # one rank's heartbeat; ours is ~200 bytes
STEP_WINDOW = 20  # the figures are medians over this many recent steps (one slow step is not a straggler)


def default_path(environ: dict[str, str] | os._Environ = os.environ) -> str | None:
    """The termination message path: $DDPJOB_TERMINATION_LOG, else /dev/termination-log when it exists.

    Records are only ever written into an existing file (the kubelet creates it), never a
    new one, so a local run or a sandbox without a kubelet writes nothing.
    """
    explicit = environ.get(ENV_PATH)
    if explicit:
        return explicit
    return DEFAULT_PATH if os.path.isfile(DEFAULT_PATH) else None


def progress_port(environ: dict[str, str] | os._Environ = os.environ) -> int | None:
    """The port from $DDPJOB_PROGRESS_PORT; None when unset (no endpoint) or not a port number."""
    text = environ.get(PORT_ENV, "")
    if not text:
        return None
    if not text.isdigit() or not 0 <= int(text) <= 65535:
        log.warning("ignoring %s=%r: not a port number 0..65535; progress is not served", PORT_ENV, text)
        return None
    return int(text)


class ProgressReport:
    """The record of one node, rewritten whenever it changes.

    Args:
        path: the termination message file; None, missing or unwritable turns reporting off silently.
        progress_file: ``<snapshot dir>/progress.json``; None without snapshots.
        node: this node's index (DDPJOB_NODE_INDEX), for people reading the message.
        port: serve the record at GET /progress on this port (0: any free port); None: no endpoint.
    """

    def __init__(self, path: str | os.PathLike | None, progress_file: str | os.PathLike | None,
                 node: str = "", port: int | None = None):
        self.path = Path(path) if path else None
        self.progress_file = Path(progress_file) if progress_file else None
        self.record: dict[str, Any] = progress_record.new_record(node, progress_record.now())
        self.record.update(identity())
        fatal = _fatal_in(self.path)
        if fatal is not None:  # an earlier worker of this container said: do not retry
            self.record["fatal"] = dict(fatal)
        self._lock = threading.Lock()  # the async snapshot writer thread reports too
        self._seen_mtime: int | None = None
        self._polled = 0.0
        self._size = 0
        self._published = b""  # the last record written, as served over HTTP
        self._closed = threading.Event()  # stops the heartbeat gatherer
        self._server = _serve(self, port) if port is not None else None

    @property
    def enabled(self) -> bool:
        return self.path is not None or self._server is not None

    @property
    def port(self) -> int | None:
        """The port the record is served on; None when it is not served."""
        return self._server.port if self._server is not None else None

    def published(self) -> bytes:
        with self._lock:
            return self._published

    def close(self) -> None:
        """Stops serving the record and gathering heartbeats (the termination message stays for the kubelet)."""
        self._closed.set()
        if self._server is not None:
            self._server.close()
            self._server = None

    def resumed(self, step: int | None, snapshot_time: str | None, worker_restarts: int | None = None) -> None:
        """This worker starts from the snapshot at ``step`` (None: from scratch); ``worker_restarts``:
        how often torchrun restarted this container's workers before (TORCHELASTIC_RESTART_COUNT)."""
        self.record["resume"].update(fromStep=step, fromSnapshotTime=snapshot_time, workerRestarts=worker_restarts)
        self.refresh(force=True)

    def stepped(self) -> None:
        """Called after every optimizer step: notes the first one, copies a newer progress.json."""
        if self.record["resume"]["firstStepTime"] is None:
            self.record["resume"]["firstStepTime"] = progress_record.now()
            self.refresh(force=True)
        else:
            self.refresh()

    def failed(self, error: BaseException) -> None:
        """Training raised: keep the reason in the record (the kubelet's log fallback is then not used);
        a DoNotRetry also sets ``fatal``, so the operator fails the job instead of retrying."""
        self.record["error"] = f"{type(error).__name__}: {error}"[:MAX_ERROR_CHARS]
        if isinstance(error, DoNotRetry):
            message = str(error) or type(error).__name__
            self.record["fatal"] = {"reason": error.reason, "message": message[:MAX_ERROR_CHARS]}
        self.refresh(force=True)

    def refresh(self, force: bool = False) -> None:
        """Re-reads progress.json (at most every POLL_SECONDS unless ``force``) and rewrites the record."""
        if not self.enabled:
            return
        if not force and time.monotonic() - self._polled < POLL_SECONDS:
            return
        self._polled = time.monotonic()
        changed = self._read_progress()
        if changed or force:
            self._write()

    def _read_progress(self) -> bool:
        if self.progress_file is None:
            return False
        try:
            mtime = self.progress_file.stat().st_mtime_ns
            if mtime == self._seen_mtime:
                return False
            snapshot = json.loads(self.progress_file.read_text())
        except (OSError, ValueError):  # not written yet, or replaced under us: next poll
            return False
        self._seen_mtime = mtime
        problem = progress_record.check_snapshot(snapshot)
        if problem is not None:  # the operator would refuse the whole record: keep the last good snapshot
            log.warning("not reporting %s: %s", self.progress_file, problem.message)
            return False
        self.record["snapshot"] = snapshot
        return True

    def watch(self, heartbeats: Heartbeats) -> None:
        """Gathers every rank's heartbeat into ``nodes`` every HEARTBEAT_SECONDS, on a thread of its
        own: a training thread stuck in data loading or a collective cannot stop the report."""
        if self.enabled:
            threading.Thread(target=self._gather_forever, args=(heartbeats,), name="ddpjob-heartbeats",
                             daemon=True).start()

    def _gather_forever(self, heartbeats: Heartbeats) -> None:
        while not self._closed.wait(heartbeats.gather_seconds):
            try:
                self._gather(heartbeats)
            except Exception:  # noqa: BLE001 - one bad pass must not end the reporting for good
                log.warning("gathering heartbeats failed; trying again in %.1f s", heartbeats.gather_seconds,
                            exc_info=True)

    def _gather(self, heartbeats: Heartbeats) -> None:
        self.refresh()  # a training thread stuck in a collective no longer copies progress.json
        nodes = heartbeats.gather()
        if nodes:
            with self._lock:
                self.record["nodes"] = nodes
            self._write(message=False)

    def _write(self, message: bool = True) -> None:
        with self._lock:
            if "fatal" not in self.record:  # another local rank raised DoNotRetry and wrote the message
                fatal = _fatal_in(self.path)
                if fatal is not None:
                    self.record["fatal"] = dict(fatal)
            self.record["written"] = progress_record.now()
            try:
                published = progress_record.encode(self.record)
                message_bytes = progress_record.encode(self.record, TERMINATION_MESSAGE_BYTES)
            except ValueError as error:  # a value this worker put in: keep publishing the last good record
                log.warning("not publishing the progress record: %s", error)
                return
            self._published = published
            if self.path is not None and message:
                self._write_message(message_bytes)

    def _write_message(self, data: bytes) -> None:
        padded = data.ljust(max(RECORD_BYTES, self._size))
        try:
            # Never O_CREAT: the kubelet creates the file before the container starts; a
            # missing one means no kubelet (a local run or a sandbox), and creating
            # /dev/termination-log on a host would leak records between runs.
            fd = os.open(self.path, os.O_WRONLY)
            try:
                # A worker restarted in the same container finds its predecessor's record.
                padded = padded.ljust(os.fstat(fd).st_size)
                os.pwrite(fd, padded, 0)
            finally:
                os.close(fd)
        except OSError as error:  # e.g. a read-only root filesystem: reporting is best effort
            log.debug("not writing the termination message %s: %s", self.path, error)
            self.path = None
            return
        self._size = len(padded)


def identity(environ: dict[str, str] | os._Environ = os.environ) -> dict[str, str]:
    """The record's jobUID and pod, from the variables the operator renders (IDENTITY_ENV); a
    value the contract would refuse is left out with a warning (the record stays publishable)."""
    found = {}
    for key, name in IDENTITY_ENV.items():
        value = environ.get(name, "")
        if not value:
            continue
        problem = progress_record.validate({"kind": progress_record.KIND, "version": progress_record.VERSION,
                                            key: value})
        if isinstance(problem, progress_record.Invalid):
            log.warning("not naming the %s in the progress record: %s=%s", key, name, problem.message)
            continue
        found[key] = value
    return found


def _fatal_in(path: Path | None) -> dict[str, Any] | None:
    """``fatal`` of the record already in the termination message (an earlier worker's), if any."""
    if path is None:
        return None
    try:
        with open(path, "rb") as file:
            data = file.read(progress_record.MAX_RECORD_BYTES + 1)
    except OSError:
        return None
    found = progress_record.parse(data.rstrip())  # the padding is not part of the record
    return found.fatal if isinstance(found, progress_record.Record) else None


class _ProgressServer:
    """GET /progress on one thread, an event loop, whatever the number of clients.

    The endpoint is reachable by whatever reaches the pod, so a client is not trusted to finish:
    http.server's ThreadingHTTPServer had no timeout and a thread per connection (measured: 50
    half-sent requests held 50 threads, each until its client left). Here each connection has
    READ_TIMEOUT_SECONDS for its whole exchange, and at most MAX_CONNECTIONS are open: a new one
    beyond closes the oldest, so a client that holds connections open delays nobody long (the
    operator's poll gives a pod 2 s, controller/live_progress.py).
    """

    def __init__(self, report: ProgressReport, server: socket.socket):
        self._report = report
        self.port = server.getsockname()[1]
        self._open: dict[asyncio.StreamWriter, None] = {}  # the open connections, oldest first
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, args=(server,), name="ddpjob-progress", daemon=True)
        self._thread.start()

    def _run(self, server: socket.socket) -> None:
        asyncio.set_event_loop(self._loop)
        listening = self._loop.run_until_complete(
            asyncio.start_server(self._connected, sock=server, limit=MAX_REQUEST_BYTES))
        self._loop.run_forever()
        listening.close()
        # Every connection's handler ends here, so none is left pending when the loop closes.
        handlers = asyncio.all_tasks(self._loop)
        for handler in handlers:
            handler.cancel()
        self._loop.run_until_complete(asyncio.gather(*handlers, return_exceptions=True))
        self._loop.close()

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._open) >= MAX_CONNECTIONS:
            oldest = next(iter(self._open))
            del self._open[oldest]
            oldest.transport.abort()  # its handler sees the end of its stream and returns
        self._open[writer] = None
        try:
            await asyncio.wait_for(self._exchange(reader, writer), READ_TIMEOUT_SECONDS)
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            pass  # too slow, gone, or a request over MAX_REQUEST_BYTES: nothing to answer
        finally:
            self._open.pop(writer, None)
            writer.transport.abort()  # a no-op once the answer was sent and the connection closed

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        request = head.split(b"\r\n", 1)[0].split()
        ours = len(request) == 3 and request[0] == b"GET" and request[1] == HTTP_PATH.encode()
        body = self._report.published() if ours else b""
        status = b"200 OK" if body else b"404 Not Found"
        writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\nContent-Length: "
                     + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
        writer.close()  # after the answer is sent (drain() alone returns while it is still buffered)
        await writer.wait_closed()


def _serve(report: ProgressReport, port: int) -> _ProgressServer | None:
    host = listen_host()
    try:
        server = listening_socket(host, port)
    except OSError as error:
        log.warning("not serving training progress on port %d of %s (%s): the operator will learn it only when "
                    "this container exits", port, host or "every interface", error)
        return None
    return _ProgressServer(report, server)


# --- Liveness: every rank's heartbeat, gathered into the record's `nodes` ------------------

class StepClock:
    """One rank's recent step figures: wall time per step, and the two parts of it that no
    collective holds up, which tell a slow node from one waiting for the others.

    Data time runs from the end of a step (or micro-step) to the next batch in hand: the input
    pipeline, and whatever the script does between steps. Compute time is the forward pass,
    which runs before the step's first collective (DDP all-reduces during backward). A rank
    that waits for a slow peer waits in backward, which neither figure counts. On a GPU the
    forward is timed on the host, so a slow device shows only where the host waits for it.
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter, window: int = STEP_WINDOW):
        self._clock = clock
        self._mark = self._step_start = clock()
        self._data = self._compute = 0.0
        self._recent: collections.deque[tuple[float, float, float]] = collections.deque(maxlen=window)

    def batch_ready(self) -> None:
        now = self._clock()
        self._data += now - self._mark
        self._mark = now

    def forward_done(self) -> None:
        now = self._clock()
        self._compute += now - self._mark
        self._mark = now

    def micro_step_done(self) -> None:
        self._mark = self._clock()

    def stepped(self) -> None:
        now = self._clock()
        self._recent.append((now - self._step_start, self._data, self._compute))
        self._mark = self._step_start = now
        self._data = self._compute = 0.0

    def figures(self) -> dict[str, float]:
        """Medians over the recent steps: stepSeconds, dataSeconds, computeSeconds ({} before a step)."""
        if not self._recent:
            return {}
        names = ("stepSeconds", "dataSeconds", "computeSeconds")
        return {name: round(statistics.median(r[i] for r in self._recent), 4) for i, name in enumerate(names)}


class Heartbeats:
    """Each rank's heartbeat, a key per rank in the process group's store, and a reporter's view of them.

    A thread of each rank writes ``{node, step, heartbeat, phase, figures}`` under HEARTBEAT_PREFIX +
    rank every HEARTBEAT_SECONDS: a set in the store, not a collective, so it goes on while the
    training thread is stuck, and stops only with the process. ``phase`` is where the training
    thread is: ``local`` from the end of a step to the end of its forward pass (input, forward,
    the script's own code: no peer holds it up), ``collective`` from there to the step's end
    (backward's all-reduces, the optimizer). When a group stops, the nodes still ``local`` are
    the ones the others wait for. Every node's reporter (ProgressReport.watch) reads all the keys
    and folds them into one entry per node, because the operator reads one node's record. The
    store is torchrun's worker store: a new set of workers starts with fresh keys.

    Args:
        store: the store (``torch.distributed`` Store: set, get, check); None turns this off.
        rank, world_size: this worker's global rank and the group's size.
        node: this worker's DDPJOB_NODE_INDEX.
    """

    def __init__(self, store: Any, rank: int, world_size: int, node: str):
        self.store, self.rank, self.world_size, self.node = store, rank, world_size, node
        self.steps = StepClock()
        self.step: int | None = None
        self.phase = "local"
        self._stop = threading.Event()
        self._refused: set[tuple[str, str, str]] = set()  # (key, field, rule) of beats already logged as skipped

    def start(self, step: int | None) -> None:
        """Beats from now on (the training thread only updates ``step`` and ``phase``)."""
        self.step = step
        if self.store is not None:
            self.beat()
            threading.Thread(target=self._beat_forever, name="ddpjob-heartbeat", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def stepped(self, step: int) -> None:
        """The training thread finished ``step``."""
        self.steps.stepped()
        self.step, self.phase = step, "local"

    def in_collective(self) -> None:
        """The training thread finished a forward pass: from here it may wait for its peers."""
        self.steps.forward_done()
        self.phase = "collective"

    @contextlib.contextmanager
    def collective(self) -> Iterator[None]:
        """Marks a stretch that waits for the other ranks (a snapshot, validation): ``collective``
        inside, ``local`` after (the next batch is fetched next)."""
        self.phase = "collective"
        try:
            yield
        finally:
            self.phase = "local"

    def local(self) -> None:
        """The training thread finished a micro-step's backward: own work again until the next forward."""
        self.steps.micro_step_done()
        self.phase = "local"

    def beat(self) -> None:
        """Writes this rank's heartbeat now."""
        try:
            figures = self.steps.figures()
        except RuntimeError:  # the training thread appended meanwhile: the next beat has them
            figures = {}
        beat = {"node": self.node, "step": self.step, "heartbeat": progress_record.now(), "phase": self.phase,
                **figures}
        try:
            self.store.set(HEARTBEAT_PREFIX + str(self.rank), json.dumps(beat))
        except Exception as error:  # the store went with its host: the workers are about to restart
            log.debug("heartbeat not written: %s", error)

    def _beat_forever(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            self.beat()

    @property
    def gather_seconds(self) -> float:
        """How often a reporter gathers: every HEARTBEAT_SECONDS up to GATHER_RANKS ranks, less often
        above, so that every node reading every key keeps the store's load bounded."""
        return HEARTBEAT_SECONDS * max(1.0, self.world_size / GATHER_RANKS)

    def gather(self) -> list[dict[str, Any]]:
        """One entry per node (lowest index first, at most MAX_NODES) from the ranks' heartbeats;
        [] when none could be read."""
        keys = [HEARTBEAT_PREFIX + str(rank) for rank in range(self.world_size)]
        try:
            if self.store.check(keys):  # every rank beat: one round trip for all
                raw = self.store.multi_get(keys)
            else:  # a get would wait for a rank that never wrote: ask one by one
                raw = [self.store.get(key) if self.store.check([key]) else b"" for key in keys]
        except Exception as error:  # the store is gone (its host failed): nothing to report
            log.debug("heartbeats not read: %s", error)
            return []
        beats = [self._beat(key, data) for key, data in zip(keys, raw)]
        return fold([b for b in beats if b is not None])

    def _beat(self, key: str, raw: bytes) -> dict[str, Any] | None:
        """The heartbeat at ``key``, or None when there is none or it breaks the record's rules for
        a ``nodes`` entry (logged once per key and rule): the store is writable by every worker,
        and one bad beat must cost only its own entry."""
        beat, problem = parse_beat(raw)
        if problem is not None and (key, problem.field, problem.rule) not in self._refused:
            self._refused.add((key, problem.field, problem.rule))
            log.warning("skipping the heartbeat at %s: %s", key, problem.message)
        return beat


def parse_beat(raw: bytes) -> tuple[dict[str, Any] | None, progress_record.Invalid | None]:
    """(the heartbeat, None), (None, why it is refused), or (None, None) when ``raw`` is empty."""
    if not raw:
        return None, None
    if len(raw) > MAX_BEAT_BYTES:
        return None, progress_record.Invalid("heartbeat", f"{len(raw)} bytes", f"must be at most {MAX_BEAT_BYTES}")
    try:
        beat = json.loads(raw, parse_constant=_no_constant)
    except (ValueError, RecursionError) as error:
        return None, progress_record.Invalid("heartbeat", progress_record.shorten(repr(raw)),
                                             f"must be a JSON object ({progress_record.shorten(str(error), 80)})")
    problem = progress_record.check_node_entry(beat)
    return (None, problem) if problem is not None else (beat, None)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def fold(beats: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ranks' heartbeats as one entry per node: its lowest step, its oldest heartbeat, and the
    figures of its slowest rank (the most data + compute time), each checked by the record's rules."""
    by_node: dict[str, list[dict[str, Any]]] = {}
    for beat in beats:
        by_node.setdefault(str(beat.get("node", "")), []).append(beat)
    nodes = []
    for node in sorted(by_node, key=lambda n: (not n.isdigit(), int(n) if n.isdigit() else 0, n)):
        ranks = by_node[node]
        steps = [b["step"] for b in ranks if isinstance(b.get("step"), int)]
        slowest = max(ranks, key=lambda b: (b.get("dataSeconds") or 0) + (b.get("computeSeconds") or 0))
        entry = {"node": node, "step": min(steps) if steps else None,
                 "heartbeat": min((b["heartbeat"] for b in ranks if b.get("heartbeat")), default=None),
                 "phase": "local" if any(b.get("phase") == "local" for b in ranks) else "collective",
                 "stepSeconds": max((b["stepSeconds"] for b in ranks if b.get("stepSeconds") is not None),
                                    default=None),
                 **{k: slowest.get(k) for k in ("dataSeconds", "computeSeconds")}}
        entry = {k: v for k, v in entry.items() if v is not None}
        nodes.append(entry)
    return nodes[:progress_record.MAX_NODES]


def stop_agent(environ: dict[str, str] | os._Environ = os.environ) -> bool:
    """Stops this worker's torchrun agent (SIGTERM), so that the container exits now with the
    record's ``fatal`` instead of torchrun restarting the workers elasticPolicy.maxRestarts times
    first (each would raise DoNotRetry again). Only in a pod, where the operator reads the record
    from the termination message, and only when the parent process is torchrun. Returns whether
    it signalled."""
    if not environ.get("TORCHELASTIC_RUN_ID") or default_path(environ) is None:
        return False
    # A worker forked by the zygote has the fork server as its parent; its client names the agent.
    parent = int(environ.get(zygote.AGENT_PID_ENV) or os.getppid())
    try:
        command = Path(f"/proc/{parent}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return False
    if b"torchrun" not in command and b"torch.distributed.run" not in command:
        return False
    log.error("DoNotRetry: stopping the torchrun agent (pid %d) so the pod fails now", parent)
    os.kill(parent, signal.SIGTERM)
    return True


def give_up(error: DoNotRetry, *, written: bool = False, environ: dict[str, str] | os._Environ = os.environ) -> None:
    """Makes ``error`` fail the pod now: the termination message gets a record with ``fatal``
    (unless this worker's report ``written`` it already; a node's reporting rank rewrites the
    message with its full record and keeps ``fatal``), then the torchrun agent is stopped
    (stop_agent)."""
    if not written:
        ProgressReport(default_path(environ), None, node=environ.get("DDPJOB_NODE_INDEX", "")).failed(error)
    stop_agent(environ)
