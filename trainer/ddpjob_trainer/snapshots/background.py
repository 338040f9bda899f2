"""One job at a time on a background thread, its error handed back to the thread that waits.

Both snapshot tiers overlap their writes with training this way (snapshot.SnapshotStore to
the volume, fast_snapshot.FastSnapshots to /dev/shm): the training thread starts a write,
goes on, and before the next one (or at the end) waits for it and sees what it raised.
"""
from __future__ import annotations

import threading
from typing import Any, Callable


class BackgroundJob:
    """Runs one callable at a time on a thread; ``wait`` joins it and returns its error."""

    def __init__(self, name: str, daemon: bool) -> None:
        # daemon: whether the interpreter may exit while the job runs (a volume snapshot must
        # not be cut short: not a daemon; a shared-memory copy may: a daemon).
        self._name, self._daemon = name, daemon
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def start(self, target: Callable[..., Any], *args: Any) -> None:
        """Starts ``target(*args)``; the previous job must have been waited for."""
        self._thread = threading.Thread(target=self._run, args=(target, *args), name=self._name, daemon=self._daemon)
        self._thread.start()

    def wait(self) -> BaseException | None:
        """Blocks until the job is done; what it raised (once), or None."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        error, self._error = self._error, None
        return error

    def _run(self, target: Callable[..., Any], *args: Any) -> None:
        try:
            target(*args)
        except BaseException as error:  # noqa: BLE001 - handed to the thread that waits
            self._error = error
