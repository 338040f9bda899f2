"""No first-run stagger on a re-rendezvous.

torch's ``DynamicRendezvousHandler.next_rendezvous`` sleeps a random 0-0.3 s before it joins
while the rendezvous state's round is 0 ("our first run"), so that a job's nodes, all starting
at once, do not all hit the backend in the same instant. But a job's first round is round 0,
and the state stays in round 0 until a node re-rendezvouses: the survivors of the job's first
node loss were still "in round 0" and paid ~0.15 s (up to 0.3 s) of that sleep on the restart's
critical path (bench/recovery.py), where torch does not stagger a re-rendezvous from any later
round. :class:`~.early.EarlyRendezvousHandler` skips it once its membership is known (after a
round of its own, or joining a running group): only a job's first joins are staggered.

torch gives no option for it: its module-level ``_delay`` (also the executor's one-second wait
on SYNC, which is left alone) is wrapped once here, and skips only the stagger's random range,
only in a thread inside :func:`without_first_run_stagger`.
"""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from torch.distributed.elastic.rendezvous import dynamic_rendezvous

_torch_delay = dynamic_rendezvous._delay
_skipping = threading.local()


def _delay(seconds: float | tuple[float, float]) -> None:
    """torch's ``_delay``, except a random range (the first-run stagger) while skipping."""
    if isinstance(seconds, tuple) and getattr(_skipping, "on", False):
        return
    _torch_delay(seconds)


@contextlib.contextmanager
def without_first_run_stagger(skip: bool = True) -> Iterator[None]:
    """Within, this thread's next_rendezvous does not stagger its join (when ``skip``)."""
    before = getattr(_skipping, "on", False)
    _skipping.on = skip
    try:
        yield
    finally:
        _skipping.on = before


dynamic_rendezvous._delay = _delay
