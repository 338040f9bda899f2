"""The fast snapshot tier: every rank's state copied to node-local shared memory every few steps.

The volume snapshot (store.py) is durable but costs a serialization, a sha256 and an
fsync, so it is taken every few hundred steps, and a SIGKILL loses the steps since. This tier
keeps a copy that survives a *worker* restart (torchrun restarts every worker on any failure or
membership change) at almost no cost to throughput:

* the state's tensors are copied into two preallocated slots, files in ``/dev/shm`` mapped as
  tensors (no serialization: a memcpy per tensor, or a device-to-host copy on a side CUDA
  stream), in a background thread that overlaps the next step's forward and backward passes.
  A contiguous CPU tensor is copied by one plain ``memmove`` (ctypes, outside the GIL), not
  ``Tensor.copy_``: called from a thread of its own, copy_ starts an OpenMP team for it that
  competes with the training thread's, and the process spent 60-220 ms of CPU on a 107 MB
  copy against 18-24 ms for memmove (2 cores, load ~20; the script: git show 5e46166^:notes/notice.md);
  Parameters and optimizer state change only in ``optimizer.step()``, so the trainer waits for
  the copy just before the next one (``wait``); small tensors (e.g. BatchNorm statistics, which
  the forward pass updates) and the non-tensor values are copied at once, before the thread starts;
* slots alternate, and ``fast-<local rank>.meta`` names the slot and the step only after that
  slot's copy is complete (written to a temporary file and renamed), so a worker killed at any
  moment leaves the previous complete copy;
* ``/dev/shm`` is memory: the copy survives the worker, not the pod (a Kubernetes node pod's
  ``/dev/shm`` is an emptyDir of medium Memory) nor the machine. A replaced node's ranks get
  the state from a rank that has it (``Trainer._resume_fast`` agrees on the newest step every
  rank can load and broadcasts it), and the volume snapshot stays the fallback.

Each worker keeps two copies of the whole state in ``/dev/shm``. The tier is on by default, so it
must never be what fails a job: before the slots are allocated, their size times the node's
workers is checked against the free space of the directory's filesystem and the headroom of the
worker's memory cgroup (tmpfs pages count against a pod's memory limit), and the slots are then
reserved with ``posix_fallocate``, which on a tmpfs fails with ENOSPC instead of letting a later
write into a mapped page raise SIGBUS. Where they do not fit the tier turns itself off with one
warning (``NoRoom``), and a SIGKILL then loses the steps since the last volume snapshot.

``/dev/shm`` is shared by every user of a machine (a local run's), and the directory's name is
predictable. So the node's directory is created with mode 0700 in one mkdir, and an existing one
is used only when it is a real directory (not a symbolic link) of this process's user that
nobody else can write; anything else is refused (UnsafeDirectory) before a byte is read or
written. Files are created afresh (O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600) under a temporary name
and renamed into place, so no link planted beforehand is followed and no state is readable by
another user.

Usage (each rank)::

    fast = FastSnapshot(fast_root("/snapshots"), local_rank=env.local_rank)
    fast.save(state, step=120)        # returns at once; the copy runs in the background
    fast.wait()                       # before the next optimizer.step()
    found = fast.load()               # (meta, state) of the newest complete copy, or None
"""
from __future__ import annotations

import contextlib
import copy
import ctypes
import errno
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from ddpjob_rdzv.contract import NODE_INDEX_ENV
from ddpjob_rdzv.contract.fast_tier import FAST_ROOT_ENV, fast_tier_dir

from ddpjob_trainer.errors import DoNotRetry
from ddpjob_trainer.snapshots.background import BackgroundJob

log = logging.getLogger(__name__)

ROOT_ENV = FAST_ROOT_ENV  # where the copies live (default /dev/shm)
SMALL_NUMEL = 1 << 16  # tensors up to this size are copied at once (the forward pass may change buffers)
ALIGN = 64  # bytes: every tensor's offset in a slot, enough for any dtype's alignment
_TENSOR = "__fast_tensor__"  # placeholder key in the skeleton: {_TENSOR: index into the slot's tensors}
DIR_MODE = 0o700  # the node's directory: its state is nobody else's to read or replace
FILE_MODE = 0o600
# Of a memory cgroup's limit, the part the slots must leave free: the worker's own memory grows
# after the first step too (validation, a larger last batch, the volume snapshot's serialization).
MEMORY_RESERVE = 0.1
CGROUP_ROOT = Path("/sys/fs/cgroup")


class UnsafeDirectory(DoNotRetry):
    """The node's fast snapshot directory exists but is not safely ours; retrying cannot fix it."""

    reason = "UnsafeFastSnapshotDirectory"


def own_directory(path: Path) -> None:
    """Makes ``path`` a directory of this process's user, mode DIR_MODE: created in one mkdir,
    or, when it exists, accepted only as a real directory of ours that nobody else can write.

    Raises:
        UnsafeDirectory: a symbolic link, not a directory, another user's, or writable by others.
    """
    path.parent.mkdir(parents=True, exist_ok=True)  # the root: /dev/shm, or $DDPJOB_FAST_SNAPSHOT_ROOT
    try:
        os.mkdir(path, DIR_MODE)
        return
    except FileExistsError:
        pass
    found = os.lstat(path)
    problem = _unsafe(found)
    if problem is not None:
        raise UnsafeDirectory(
            f"fast snapshot directory {path} (owner uid {found.st_uid}, mode {stat.filemode(found.st_mode)}) "
            f"{problem}: it must be a real directory owned by uid {os.geteuid()} that no other user can write; "
            f"remove it, or set {ROOT_ENV} to a directory of your own")
    if stat.S_IMODE(found.st_mode) != DIR_MODE:  # ours, from an older version: hide the state it will hold
        os.chmod(path, DIR_MODE)


def _unsafe(found: os.stat_result) -> str | None:
    if stat.S_ISLNK(found.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(found.st_mode):
        return "is not a directory"
    if found.st_uid != os.geteuid():
        return f"belongs to uid {found.st_uid}"
    if found.st_mode & 0o022:
        return "is writable by its group or by others"
    return None


class NoRoom(Exception):
    """The two slots do not fit in the directory's filesystem or the worker's memory cgroup."""


@dataclass(frozen=True)
class Room:
    """What the slots may take: free bytes in the directory's filesystem and, under a memory
    cgroup with a limit (a pod's), that limit and the bytes it has left (None: no limit)."""

    free: int
    memory_limit: int | None = None
    memory_left: int | None = None


def room(directory: Path) -> Room:
    """The Room of ``directory`` (its filesystem) and of this process's memory cgroup (v2)."""
    found = os.statvfs(directory)
    limit, used = _cgroup_memory()
    return Room(found.f_bavail * found.f_frsize, limit, None if limit is None or used is None else limit - used)


def _cgroup_memory() -> tuple[int | None, int | None]:
    """(memory.max, memory.current) of this process's cgroup v2, or (None, None) without a limit."""
    try:
        line = next(line for line in Path("/proc/self/cgroup").read_text().splitlines() if line.startswith("0::"))
        group = CGROUP_ROOT / line[3:].lstrip("/")
        limit = (group / "memory.max").read_text().strip()
        if limit == "max":
            return None, None
        return int(limit), int((group / "memory.current").read_text())
    except (OSError, StopIteration, ValueError):  # cgroup v1, no /proc: no limit we can read
        return None, None


def shortfall(needed: int, found: Room) -> str | None:
    """Why ``needed`` bytes of slots do not fit in ``found``, or None when they do."""
    if needed > found.free:
        return f"needs {_mb(needed)} and its filesystem has {_mb(found.free)} free"
    if found.memory_limit is not None and found.memory_left is not None:
        spare = found.memory_left - int(found.memory_limit * MEMORY_RESERVE)
        if needed > spare:
            return (f"needs {_mb(needed)} and the memory limit ({_mb(found.memory_limit)}) has "
                    f"{_mb(max(found.memory_left, 0))} left, of which {MEMORY_RESERVE:.0%} of the limit stays free")
    return None


def _mb(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB"


def create_private(path: Path) -> int:
    """A new file at ``path`` (a stale one of ours is removed first), mode FILE_MODE, write-only;
    never through a link (O_NOFOLLOW) nor onto an existing file (O_EXCL)."""
    path.unlink(missing_ok=True)  # a leftover of a process with our pid; removes a link, not its target
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)


def fast_root(snapshot_dir: str | os.PathLike, root: str | os.PathLike | None = None) -> Path:
    """This node's directory for the job that snapshots to ``snapshot_dir`` (the contract's
    fast_tier_dir). The node: ``DDPJOB_NODE_INDEX`` where the operator or ``ddpjob run`` set it,
    else torchrun's agent (the worker's parent), whose life is the one a worker restart happens
    within.
    """
    return fast_tier_dir(snapshot_dir, os.environ.get(NODE_INDEX_ENV) or f"agent{os.getppid()}", root)


class FastSnapshot:
    """One rank's double-buffered copy of its training state in ``directory``.

    Args:
        directory: this node's directory (fast_root); created here (own_directory).
        local_rank: names this worker's files (stable across restarts on the node).
        local_world_size: the node's workers, each allocating slots alike: the room for the
            slots is checked for all of them at once (they check at about the same moment).

    Attributes:
        off: why this worker's tier turned itself off (NoRoom), else None: ``save`` then does
            nothing and a restart resumes from the volume.

    Raises:
        UnsafeDirectory: see own_directory.
        OSError: the directory cannot be created (no /dev/shm).
    """

    def __init__(self, directory: str | os.PathLike, local_rank: int, local_world_size: int = 1):
        self.directory = Path(directory)
        own_directory(self.directory)  # before anything is read from it (a resume) or written
        self.local_rank = local_rank
        self.local_world_size = local_world_size
        self.off: str | None = None
        self._copying = BackgroundJob("ddpjob-fast-snapshot", daemon=True)
        self._layout: list[tuple[torch.dtype, tuple[int, ...], int]] | None = None
        self._slots: list[list[torch.Tensor]] = []
        self._next = 0
        self._stream = None

    @property
    def meta_path(self) -> Path:
        return self.directory / f"fast-{self.local_rank}.meta"

    def _slot_path(self, slot: int) -> Path:
        return self.directory / f"fast-{self.local_rank}-slot{slot}.bin"

    # -- writing -------------------------------------------------------------------

    def save(self, state: dict[str, Any], **meta: Any) -> None:
        """Starts copying ``state`` into the free slot; ``meta`` (e.g. step) is stored with it.

        The caller must not change the big tensors (parameters, optimizer state) before ``wait``.
        Does nothing once the tier is :attr:`off`; turns it off when the slots do not fit.
        """
        self.wait()
        if self.off is not None:
            return
        tensors: list[torch.Tensor] = []
        skeleton = _flatten(state, tensors)
        layout = [(t.dtype, tuple(t.shape), t.numel() * t.element_size()) for t in tensors]
        try:
            slot, targets = self._targets(layout)
        except NoRoom as error:
            self._turn_off(str(error))
            return
        big = [(src, dst) for src, dst in zip(tensors, targets) if src.numel() > SMALL_NUMEL]
        for src, dst in zip(tensors, targets):
            if src.numel() <= SMALL_NUMEL:
                copy_into(dst, src)
        record = {"slot": slot, "skeleton": skeleton, "layout": [(str(d), s, n) for d, s, n in layout], **meta}
        ready = self._ready_event(big)
        self._copying.start(self._copy, big, ready, record)
        self._next = 1 - slot

    def wait(self) -> None:
        """Blocks until the pending copy is complete; re-raises its error."""
        error = self._copying.wait()
        if error is not None:
            raise RuntimeError(f"fast snapshot to {self.directory} failed: {error}") from error

    def remove(self) -> None:
        """Deletes this rank's copies (training finished: nothing will resume from them), and the
        node's directory once no rank's are left in it. The directory is shared by the node's local
        ranks: removing it whole while another rank's copy thread still wrote its meta failed that
        rank's last copy (FileNotFoundError), so each rank takes only its own files."""
        self.wait()
        self._slots = []
        for path in (self.meta_path, self._slot_path(0), self._slot_path(1)):
            path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # another rank's files are still there, or already gone
            self.directory.rmdir()

    def _turn_off(self, why: str) -> None:
        """Off for the rest of this worker's run, with one warning; its files go (they hold memory,
        and a meta naming slots that were never written must not be resumed from)."""
        self.off = why
        self._slots, self._layout = [], None
        for path in (self.meta_path, self._slot_path(0), self._slot_path(1)):
            path.unlink(missing_ok=True)
        log.warning("fast snapshot tier off for local rank %d: %s; a SIGKILL now loses the steps since the last "
                    "volume snapshot (give %s more room, or set fast_snapshot_every_steps=0 to turn the tier off "
                    "without this warning)", self.local_rank, why, self.directory.parent)

    def _copy(self, pairs: list[tuple[torch.Tensor, torch.Tensor]], ready: Any, record: dict[str, Any]) -> None:
        if ready is not None:  # CUDA: copy on a side stream once the step's kernels are done
            with torch.cuda.stream(self._stream):
                self._stream.wait_event(ready)
                for src, dst in pairs:
                    dst.copy_(src.detach(), non_blocking=False)
        else:
            for src, dst in pairs:
                copy_into(dst, src)
        tmp = self.meta_path.with_name(f".{self.meta_path.name}.tmp-{os.getpid()}")
        with os.fdopen(create_private(tmp), "wb") as file:
            torch.save(record, file)
        os.replace(tmp, self.meta_path)  # the slot counts only from here on

    def _ready_event(self, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> Any:
        if not any(src.is_cuda for src, _ in pairs):
            return None
        if self._stream is None:
            self._stream = torch.cuda.Stream()
        event = torch.cuda.Event()
        event.record()
        return event

    def _targets(self, layout: list[tuple[torch.dtype, tuple[int, ...], int]]) -> tuple[int, list[torch.Tensor]]:
        """The free slot and its tensors for ``layout``. A restarted worker maps the slots as they
        are and writes first into the one its meta does not name, so the complete copy stays
        usable until a newer one is; a new layout (a fresh start) allocates both anew."""
        if layout != self._layout:
            own_directory(self.directory)  # remove() took it away after a finished run
            current = self.newest()
            keep = current is not None and _parse_layout(current["layout"]) == layout
            created = [i for i in (0, 1) if not keep or i != current["slot"]]
            size = _offsets(layout)[1]
            problem = shortfall(size * len(created) * self.local_world_size, room(self.directory))
            if problem is not None:
                raise NoRoom(f"{self.directory}: {len(created)} slot(s) of {_mb(size)} for each of the node's "
                             f"{self.local_world_size} worker(s) {problem}")
            if not keep:
                self.meta_path.unlink(missing_ok=True)  # it describes slots about to be reallocated
            self._slots = [_map_slot(self._slot_path(i), layout, create=i in created) for i in (0, 1)]
            self._next = 1 - current["slot"] if keep else 0
            self._layout = layout
        return self._next, self._slots[self._next]

    # -- reading -------------------------------------------------------------------

    def newest(self) -> dict[str, Any] | None:
        """The meta of the newest complete copy (step, ...), or None when there is none readable."""
        try:
            return torch.load(self.meta_path, weights_only=True)
        except FileNotFoundError:
            return None
        except Exception as error:  # noqa: BLE001 - a copy from an older version, a torn tmpfs: not resumable
            log.warning("fast snapshot meta %s is unreadable (%s); ignoring it", self.meta_path, error)
            return None

    def load(self, meta: dict[str, Any], map_location: Any = None) -> dict[str, Any]:
        """The state ``meta`` describes, copied out of shared memory (the next save reuses the slot)."""
        return unflatten(meta["skeleton"], self.load_tensors(meta, map_location))

    def load_tensors(self, meta: dict[str, Any], map_location: Any = None) -> list[torch.Tensor]:
        """The tensors of the copy ``meta`` describes, in flatten's order, as copies."""
        views = _map_slot(self._slot_path(meta["slot"]), _parse_layout(meta["layout"]), create=False)
        return [view.to(map_location, copy=True) if map_location is not None else view.clone() for view in views]


def copy_into(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.copy_(src)``; for contiguous CPU tensors of one dtype and size (a slot's views, and
    almost every parameter and optimizer state), one memmove: single-threaded, outside the GIL."""
    src = src.detach()
    if (src.device.type == "cpu" and dst.device.type == "cpu" and src.layout == dst.layout == torch.strided
            and src.dtype == dst.dtype and src.shape == dst.shape and src.is_contiguous() and dst.is_contiguous()):
        nbytes = src.numel() * src.element_size()
        if nbytes:
            ctypes.memmove(dst.data_ptr(), src.data_ptr(), nbytes)
        return
    dst.copy_(src)


def skeleton_layout(meta: dict[str, Any]) -> tuple[Any, list[tuple[torch.dtype, tuple[int, ...], int]]]:
    """What a receiver needs to rebuild a broadcast state: the skeleton and each tensor's dtype and shape."""
    return meta["skeleton"], _parse_layout(meta["layout"])


def flatten(state: Any) -> tuple[Any, list[torch.Tensor]]:
    """``state`` with every tensor replaced by a placeholder, and the tensors in order."""
    tensors: list[torch.Tensor] = []
    return _flatten(state, tensors), tensors


def unflatten(skeleton: Any, tensors: list[torch.Tensor]) -> Any:
    """The inverse of flatten."""
    if isinstance(skeleton, dict):
        if set(skeleton) == {_TENSOR}:
            return tensors[skeleton[_TENSOR]]
        return {key: unflatten(value, tensors) for key, value in skeleton.items()}
    if isinstance(skeleton, list):
        return [unflatten(value, tensors) for value in skeleton]
    if isinstance(skeleton, tuple):
        return tuple(unflatten(value, tensors) for value in skeleton)
    return skeleton


def _flatten(value: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return {_TENSOR: len(tensors) - 1}
    if isinstance(value, dict):
        return {key: _flatten(item, tensors) for key, item in value.items()}
    if isinstance(value, list):
        return [_flatten(item, tensors) for item in value]
    if isinstance(value, tuple):
        return tuple(_flatten(item, tensors) for item in value)
    return copy.deepcopy(value)  # numbers, strings: the loop may change the originals meanwhile


def _parse_layout(layout: list[tuple[str, Any, int]]) -> list[tuple[torch.dtype, tuple[int, ...], int]]:
    return [(getattr(torch, dtype.removeprefix("torch.")), tuple(shape), nbytes) for dtype, shape, nbytes in layout]


def _offsets(layout: list[tuple[torch.dtype, tuple[int, ...], int]]) -> tuple[list[int], int]:
    offsets, total = [], 0
    for _, _, nbytes in layout:
        offsets.append(total)
        total += -(-nbytes // ALIGN) * ALIGN
    return offsets, max(total, 1)


def _map_slot(path: Path, layout: list[tuple[torch.dtype, tuple[int, ...], int]],
              create: bool = True) -> list[torch.Tensor]:
    """Tensors viewing the file ``path`` (created at the layout's size when ``create``)."""
    offsets, total = _offsets(layout)
    if create:
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        fd = create_private(tmp)
        try:
            # Reserved now, not on first write: a tmpfs that fills up (another worker, another job)
            # answers ENOSPC here; a sparse file would answer with SIGBUS in the copy thread.
            os.posix_fallocate(fd, 0, total)
        except OSError as error:
            tmp.unlink(missing_ok=True)
            if error.errno in (errno.ENOSPC, errno.EDQUOT):
                raise NoRoom(f"{path.parent} has no room for {_mb(total)}: {error.strerror}") from error
            raise
        finally:
            os.close(fd)
        os.replace(tmp, path)  # replaces whatever is at `path`, a link included, never its target
    elif path.stat().st_size != total:
        raise RuntimeError(f"fast snapshot slot {path} holds {path.stat().st_size} bytes, its meta says {total}")
    flat = torch.from_file(str(path), shared=True, size=total, dtype=torch.uint8)
    return [flat[offset:offset + nbytes].view(dtype).view(shape)
            for offset, (dtype, shape, nbytes) in zip(offsets, layout)]

