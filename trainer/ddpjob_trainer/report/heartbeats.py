"""Liveness: every rank's heartbeat in the process group's store, folded into the record's ``nodes``.

Each rank writes a small JSON beat (its step, its phase, its recent step figures) under
HEARTBEAT_PREFIX + rank every HEARTBEAT_SECONDS; each node's reporting worker gathers them and
folds them into one entry per node (the operator's hang and straggler rules read them,
decide/hang.py and decide/straggler.py). The store is writable by every worker, so each beat is
checked by the record's rules for a ``nodes`` entry (ddpjob_rdzv's progress record) before use.
"""
from __future__ import annotations

import collections
import contextlib
import json
import logging
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from ddpjob_rdzv.contract import progress_record

log = logging.getLogger(__name__)

HEARTBEAT_PREFIX = "ddpjob/heartbeat/"  # + rank: each rank's heartbeat key in the process group's store
HEARTBEAT_SECONDS = 1.0  # each rank writes its heartbeat, and each reporter gathers them, this often
GATHER_RANKS = 64  # above this many ranks, reporters gather less often (every node reads every key)
MAX_BEAT_BYTES = 4096  # one rank's heartbeat; ours is ~200 bytes
STEP_WINDOW = 20  # the figures are medians over this many recent steps (one slow step is not a straggler)


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

