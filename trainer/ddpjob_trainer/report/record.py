"""A node's progress record for the operator: written to the termination message and served at GET /progress.

The record (layout and rules: ``ddpjob_rdzv/contract/progress_record.py``, shared with the operator)
says where training stands: the newest complete snapshot, when this run of the workers
started and took its first step, and why training raised. Each node's local-rank-0 worker
keeps it current and publishes it two ways, neither of which gives training pods API rights
(no ServiceAccount token, no RBAC to patch the DDPJob):

* **the termination message**: the kubelet copies the file at ``terminationMessagePath``
  into ``status.containerStatuses[].state.terminated.message`` whenever the container exits
  (crash, kill, success), and the operator already watches its pods. It is seen only once
  the container has exited, and holds at most ``TERMINATION_MESSAGE_BYTES`` (4096);
* **GET /progress** (server.py) on ``$DDPJOB_PROGRESS_PORT`` (set in rendered pods; the address is
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

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from ddpjob_rdzv.contract import JOB_UID_ENV, POD_NAME_ENV, PROGRESS_PORT_ENV, TERMINATION_LOG_ENV, progress_record
from ddpjob_rdzv.contract.progress_record import MAX_ERROR_CHARS, TERMINATION_MESSAGE_BYTES

from ddpjob_trainer.errors import DoNotRetry
from ddpjob_trainer.report.heartbeats import Heartbeats
from ddpjob_trainer.report.server import serve

log = logging.getLogger(__name__)

DEFAULT_PATH = "/dev/termination-log"  # Kubernetes' default terminationMessagePath
RECORD_BYTES = 1024  # minimum padded size of the message (the kubelet keeps up to 4096 bytes)
POLL_SECONDS = 5.0  # how often nodes other than rank 0's copy progress.json from the shared volume
# Whose record it is (rendered pods set both; ddpjob run the uid): the operator refuses a record
# that names another job or pod (decide/progress.py), e.g. one read at a pod IP another pod reused.
IDENTITY_ENV = {"jobUID": JOB_UID_ENV, "pod": POD_NAME_ENV}


def default_path(environ: dict[str, str] | os._Environ = os.environ) -> str | None:
    """The termination message path: $DDPJOB_TERMINATION_LOG, else /dev/termination-log when it exists.

    Records are only ever written into an existing file (the kubelet creates it), never a
    new one, so a local run or a sandbox without a kubelet writes nothing.
    """
    explicit = environ.get(TERMINATION_LOG_ENV)
    if explicit:
        return explicit
    return DEFAULT_PATH if os.path.isfile(DEFAULT_PATH) else None


def progress_port(environ: dict[str, str] | os._Environ = os.environ) -> int | None:
    """The port from $DDPJOB_PROGRESS_PORT; None when unset (no endpoint) or not a port number."""
    text = environ.get(PROGRESS_PORT_ENV, "")
    if not text:
        return None
    if not text.isdigit() or not 0 <= int(text) <= 65535:
        log.warning("ignoring %s=%r: not a port number 0..65535; progress is not served", PROGRESS_PORT_ENV, text)
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
        self._server = serve(self.published, port) if port is not None else None

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
