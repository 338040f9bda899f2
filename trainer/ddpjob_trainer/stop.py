"""A graceful stop: SIGTERM finishes the step in flight, snapshots it, and exits.

Everything that stops a pod politely sends SIGTERM and waits its grace period: preemption,
eviction, ``kubectl scale`` down, ``kubectl delete pod``, and ``ddpjob run`` stopping a node
(SIGTERM to the agent's process group). torchrun forwards the signal to its workers. A worker
that dies of it loses every step since the last snapshot; this module turns it into a flag
instead, and the Trainer does the rest:

1. the handler only sets ``requested`` (nothing else is safe inside a signal handler);
2. the flag travels in the per-step loss all-reduce (a second number in the same tensor: no
   extra collective), so every rank learns at the same optimizer step that someone was told
   to stop, whichever node got the signal;
3. every rank then takes part in the snapshot at that step, rank 0 writes it synchronously
   (every rank reached this step's all-reduce, so rank 0 is alive: DDP replicas hold the same
   model and optimizer state, and the RNG states are gathered as for any snapshot), and a
   barrier lets the others report it before anyone exits;
4. the ranks that got the signal exit with :class:`GracefulStop` (exit code 143, as if killed
   by SIGTERM, and no error file); the others raise :class:`PeerStopped`, so their agent
   restarts them at once into a smaller group instead of waiting for a collective to time out.

The clocks that bound step 3: the pod's ``terminationGracePeriodSeconds`` (then the kubelet
SIGKILLs the container), and torchrun's own: on SIGTERM the agent SIGKILLs its workers about
30 s later whatever the pod's grace period (pytorch#119856). The snapshot must be done within
the shorter of the two; see docs/recovery.md, "What a stop costs".
"""
from __future__ import annotations

import logging
import signal
import threading
from types import FrameType

log = logging.getLogger(__name__)

GRACEFUL_EXIT_CODE = 128 + signal.SIGTERM  # what a shell or the kubelet shows for death by SIGTERM
TORCHRUN_STOP_SECONDS = 30  # torchrun's agent SIGKILLs its workers this long after forwarding SIGTERM


class GracefulStop(SystemExit):
    """This worker was told to stop (SIGTERM) and saved its step; it exits 143.

    A SystemExit, so ``@record`` writes no error file and the agent, which is shutting down
    anyway, sees the code a SIGTERM would have left.
    """

    def __init__(self, step: int):
        super().__init__(GRACEFUL_EXIT_CODE)
        self.step = step

    def __str__(self) -> str:
        return f"stopped gracefully after step {self.step} (SIGTERM); the snapshot at that step is complete"


class PeerStopped(RuntimeError):
    """Another rank was told to stop; the snapshot at ``step`` is complete and this group ends here.

    An ordinary error: the agent restarts this node's workers, which resume at the next step
    in the group that forms without the stopped node.
    """

    def __init__(self, step: int):
        super().__init__(f"a peer stopped gracefully after step {step}; the snapshot at that step is "
                         f"complete, and the workers restart without it")
        self.step = step


class StopSignal:
    """Turns SIGTERM into a flag while installed (only from the main thread, as Python requires).

    Usage::

        with StopSignal() as stop:
            ...
            if stop.requested: ...
    """

    def __init__(self, signals: tuple[int, ...] = (signal.SIGTERM,)):
        self.signals = signals
        self.requested = False
        self.received: int | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopSignal:
        if threading.current_thread() is not threading.main_thread():
            log.warning("not in the main thread: SIGTERM is not turned into a graceful stop")
            return self
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *_exc: object) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)  # type: ignore[arg-type]
        self._previous.clear()

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        self.requested = True
        self.received = signum
