"""Progress reports through the container's termination message, for the operator.

Why this channel: the kubelet copies the file at ``terminationMessagePath`` into
``status.containerStatuses[].state.terminated.message`` whenever the container exits
(crash, kill, success). The operator already watches its pods, so it learns the last
complete snapshot of every node that stops, and training pods need no API rights (no
ServiceAccount token, no RBAC to patch the DDPJob). The limit: a report is seen only
when a container exits, so a running job's progress shows up at its next failure or
at the end (see docs/recovery.md).

Each node's local-rank-0 worker keeps one record in that file::

    {"kind": "ddpjob.progress", "version": 1, "node": "2", "written": "...",
     "snapshot": {<progress.json: epoch, step, time, path, samples_consumed>} | null,
     "resume": {"time": "<worker start>", "fromStep": 120 | null,
                "fromSnapshotTime": "..." | null, "firstStepTime": "..." | null},
     "error": "<why training raised>"}                    # only after an exception

``snapshot`` is ``<snapshot dir>/progress.json`` copied verbatim (one definition of
the record; rank 0 writes it after each complete snapshot, the other nodes copy it
from the shared volume at most every POLL_SECONDS). ``resume`` lets the operator
compute the time to recover (failure -> firstStepTime) and the time lost per restart
(fromSnapshotTime -> firstStepTime). Times are RFC 3339 UTC with milliseconds.

The same record is also served over HTTP while the worker runs (``GET /progress``
on ``$DDPJOB_PROGRESS_PORT``, set in rendered pods), so the operator can show the
progress of a job that has not failed yet: the operator reaches pods as Prometheus
does, and the pods still need no API rights. It holds no more than the termination
message (epoch, step, times, the snapshot's path); a port that is taken only turns
the endpoint off, with a warning.

Writing: the kubelet bind-mounts the one file, so the usual temp-file-and-rename
cannot replace it (rename onto a mount point fails with EBUSY, and the directory is
not ours). Instead each record is written with a single ``pwrite`` at offset 0, padded
with spaces to at least the previous length: the file is never truncated, so a worker
killed at any moment leaves the previous or the new record, never an empty or mixed
one (JSON ignores the trailing spaces). The kubelet reads it only after the exit.
"""
from __future__ import annotations

import datetime
import http.server
import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

ENV_PATH = "DDPJOB_TERMINATION_LOG"  # where to write; rendered into pods with terminationMessagePath
DEFAULT_PATH = "/dev/termination-log"  # Kubernetes' default terminationMessagePath
KIND = "ddpjob.progress"  # marks our record among other termination messages
VERSION = 1
RECORD_BYTES = 1024  # minimum padded size (the kubelet keeps up to 4096 bytes per container)
MAX_ERROR_CHARS = 600  # keeps a record far below the kubelet's 4096-byte cap
POLL_SECONDS = 5.0  # how often nodes other than rank 0's copy progress.json from the shared volume
PORT_ENV = "DDPJOB_PROGRESS_PORT"  # serve the record at GET /progress on this port (rendered pods set it)
HTTP_PATH = "/progress"


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


def now_text() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


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
        self.record: dict[str, Any] = {"kind": KIND, "version": VERSION, "node": node, "snapshot": None,
                                       "resume": {"time": now_text(), "fromStep": None,
                                                  "fromSnapshotTime": None, "firstStepTime": None}}
        self._lock = threading.Lock()  # the async snapshot writer thread reports too
        self._seen_mtime: int | None = None
        self._polled = 0.0
        self._size = 0
        self._published = b""  # the last record written, as served over HTTP
        self._server = _serve(self, port) if port is not None else None

    @property
    def enabled(self) -> bool:
        return self.path is not None or self._server is not None

    @property
    def port(self) -> int | None:
        """The port the record is served on; None when it is not served."""
        return self._server.server_address[1] if self._server is not None else None

    def published(self) -> bytes:
        with self._lock:
            return self._published

    def close(self) -> None:
        """Stops serving the record (the termination message stays for the kubelet)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def resumed(self, step: int | None, snapshot_time: str | None) -> None:
        """This worker starts from the snapshot at ``step`` (None: from scratch)."""
        self.record["resume"].update(fromStep=step, fromSnapshotTime=snapshot_time)
        self.refresh(force=True)

    def stepped(self) -> None:
        """Called after every optimizer step: notes the first one, copies a newer progress.json."""
        if self.record["resume"]["firstStepTime"] is None:
            self.record["resume"]["firstStepTime"] = now_text()
            self.refresh(force=True)
        else:
            self.refresh()

    def failed(self, error: BaseException) -> None:
        """Training raised: keep the reason in the record (the kubelet's log fallback is then not used)."""
        self.record["error"] = f"{type(error).__name__}: {error}"[:MAX_ERROR_CHARS]
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
        self.record["snapshot"] = snapshot
        return True

    def _write(self) -> None:
        with self._lock:
            self.record["written"] = now_text()
            data = json.dumps(self.record, sort_keys=True).encode()
            self._published = data
            if self.path is None:
                return
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


class _ProgressHandler(http.server.BaseHTTPRequestHandler):
    report: ProgressReport  # set per server by _serve

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        body = self.report.published() if self.path == HTTP_PATH else b""
        self.send_response(200 if body else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # every poll would log a line
        pass


def _serve(report: ProgressReport, port: int) -> http.server.ThreadingHTTPServer | None:
    handler = type("Handler", (_ProgressHandler,), {"report": report})
    try:
        server = http.server.ThreadingHTTPServer(("", port), handler)
    except OSError as error:
        log.warning("not serving training progress on port %d (%s): the operator will learn it only when "
                    "this container exits", port, error)
        return None
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="ddpjob-progress", daemon=True).start()
    return server


def read_record(text: str | None) -> dict[str, Any] | None:
    """The progress record in a termination message, None when it holds something else."""
    try:
        record = json.loads(text or "")
    except ValueError:
        return None
    return record if isinstance(record, dict) and record.get("kind") == KIND else None
