"""Atomic, verified training snapshots on a volume shared by every node.

A snapshot is two files in the snapshot directory, named by global step and
epoch so that names sort in training order::

    snapshot-s0000000120-e000003.pt     torch.save() of the state dict
    snapshot-s0000000120-e000003.json   manifest: format, file, sha256, size,
                                        epoch, step, samples_consumed, time

Both are written to a temporary file in the same directory, fsynced, renamed
into place, and the directory is fsynced, data first and manifest last. A
snapshot counts only when its manifest exists and the data's sha256 matches,
so a writer killed at any point leaves either the previous snapshot or a
complete new one, never a half-written file that looks valid. (Writing in
place, as the PyTorch DDP tutorial does, corrupts the only snapshot when the
writer dies mid-write.)

A framework that writes and resumes its own checkpoint directory (Hugging Face's
Trainer) stores it with ``save_directory``: the directory is the snapshot's data, and the
manifest lists every file in it with its sha256 (snapshot_tree.py).

After each complete snapshot ``progress.json`` (``{epoch, step, time, path,
samples_consumed}``) is replaced atomically for the operator, and snapshots
beyond the newest ``keep`` are deleted, manifest first, so that a deletion
interrupted half-way never leaves a manifest pointing at missing data.

``epoch`` is the epoch training resumes at (= epochs completed) and
``samples_consumed`` how many samples of that epoch's global order were
already trained on.

Loading runs no code: snapshots are read with ``torch.load(weights_only=True)``,
which rebuilds only tensors, numbers, strings, ``None`` and lists, tuples,
dicts (and sets, ``OrderedDict``) of them. Anyone who can write the shared
volume could otherwise plant a pickle that runs code in every rank on the next
resume. The state must therefore hold only those types (the trainer stores its
RNG states as tensors, lists and ints, see ``loop.rng.rng_state``); a save whose
state holds anything else is refused before it replaces the previous snapshot,
so the problem shows at the first save, not at the resume after a failure.
Setting ``DDPJOB_TRUST_SNAPSHOTS=1`` (or ``trusted=True``) turns both checks off
and loads with ``weights_only=False``: only for a directory whose every writer
you trust, e.g. to resume from snapshots written before ddpjob stored its RNG
states this way.

When snapshot files exist but none can be read (corrupt, truncated, refused by
``weights_only``), training does not silently start over from step 0: loading
raises :class:`SnapshotsUnreadableError` naming each file and why, unless
``on_unreadable`` is ``StartOver`` (``DDPJOB_SNAPSHOT_ON_UNREADABLE``, rendered
from the DDPJob's ``spec.snapshot.onUnreadable``).

Usage::

    store = SnapshotStore("/snapshots", keep=2, rank=env.rank)
    found = store.load_latest(map_location=device)      # None on a fresh start; raises
                                                        # SnapshotsUnreadableError if none can be read
    ...
    store.save(state, epoch=3, step=120)                # no-op on ranks other than 0
    store.close()                                       # waits for an async save
"""
from __future__ import annotations

import copy
import datetime
import hashlib
import json
import logging
import os
import pickle
import re
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from ddpjob_trainer.env import (
    ON_UNREADABLE_CHOICES, SNAPSHOT_ON_UNREADABLE_ENV, TRUST_SNAPSHOTS_ENV, snapshot_on_unreadable, trust_snapshots
)
from ddpjob_trainer.errors import DoNotRetry
from ddpjob_trainer.snapshots.background import BackgroundJob
from ddpjob_trainer.snapshots.tree import TreeFiles, digest_tree, fsync_directory, hash_file, remove_tree, take_in, tree_digest, \
    verify_tree

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
DIRECTORY_FORMAT_VERSION = 2  # a manifest that lists a directory's files (older readers skip it)
DIRECTORY_SUFFIX = ".d"  # a directory snapshot's data; a file snapshot's is .pt
PROGRESS_FILE = "progress.json"
_NAME = re.compile(r"^snapshot-s(\d{10})-e(\d{6})$")
_TMP_MARK = ".tmp-"


class SnapshotError(RuntimeError):
    """A snapshot could not be written or read."""


class SnapshotsUnreadableError(DoNotRetry, RuntimeError):
    """Snapshots exist but none can be read: resuming would silently restart training from step 0.

    A DoNotRetry: every restart would find the same files, so the operator fails the job at
    once with reason SnapshotsUnreadable (spec.snapshot.onUnreadable: StartOver trains anew).
    """

    reason = "SnapshotsUnreadable"


@dataclass(frozen=True)
class SnapshotInfo:
    """What a manifest says about one complete snapshot."""

    path: str
    epoch: int
    step: int
    samples_consumed: int
    time: str
    sha256: str = ""
    size: int = 0
    files: TreeFiles = ()  # a directory snapshot's files (save_directory); empty for a file snapshot

    @property
    def manifest_path(self) -> Path:
        return Path(self.path).with_suffix(".json")

    @property
    def is_directory(self) -> bool:
        return bool(self.files)


def snapshot_stem(epoch: int, step: int) -> str:
    """Base name of a snapshot; names sort by (step, epoch)."""
    return f"snapshot-s{step:010d}-e{epoch:06d}"


class SnapshotStore:
    """Writes (rank 0 only) and reads snapshots in ``directory``.

    What a state may hold: unless ``trusted``, snapshots load with
    ``torch.load(weights_only=True)``, so a state (the user's ``extra`` dict
    included) may hold only tensors, ``int``/``float``/``bool``/``str``/
    ``bytes``/``None``, ``torch.Size``/dtypes/devices, and lists, tuples, dicts,
    sets and ``OrderedDict`` of them: model, optimizer, LR scheduler and
    GradScaler ``state_dict()`` s are such. Anything else (a numpy array, a
    dataclass, a user class) makes ``save`` raise SnapshotError naming the
    offending globals; convert it (``tensor = torch.from_numpy(array)``,
    ``dataclasses.asdict``) or, if every writer of the directory is trusted, set
    ``DDPJOB_TRUST_SNAPSHOTS=1``.

    Args:
        directory: snapshot directory, the same path on every node.
        keep: complete snapshots to keep (older ones are deleted after a newer one is complete).
        rank: global rank of this worker; only rank 0 writes.
        async_save: copy the state to CPU and write it in a background thread;
            the next save (and ``wait``/``close``) waits for it and re-raises its error.
        on_saved: called with the SnapshotInfo after each complete snapshot
            (from the writer thread when ``async_save``).
        trusted: load with ``weights_only=False`` (runs any code a snapshot holds)
            and save any picklable state; None reads ``DDPJOB_TRUST_SNAPSHOTS`` (default off).
        on_unreadable: ``Fail`` (raise SnapshotsUnreadableError) or ``StartOver``
            (warn, and start from scratch) when snapshots exist but none can be
            read; None reads ``DDPJOB_SNAPSHOT_ON_UNREADABLE`` (default ``Fail``).
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        keep: int = 2,
        *,
        rank: int = 0,
        async_save: bool = False,
        on_saved: Callable[[SnapshotInfo], None] | None = None,
        trusted: bool | None = None,
        on_unreadable: str | None = None,
    ):
        if keep < 1:
            raise ValueError(f"SnapshotStore keep ({keep}) must be >= 1: the newest snapshot is always kept")
        if on_unreadable is not None and on_unreadable not in ON_UNREADABLE_CHOICES:
            raise ValueError(f"SnapshotStore on_unreadable ({on_unreadable!r}) must be one of "
                             f"{', '.join(ON_UNREADABLE_CHOICES)}")
        self.trusted = trust_snapshots() if trusted is None else trusted
        self.on_unreadable = snapshot_on_unreadable() if on_unreadable is None else on_unreadable
        self.directory = Path(directory)
        self.keep = keep
        self.rank = rank
        self.async_save = async_save
        self.on_saved = on_saved
        self._saving = BackgroundJob("ddpjob-snapshot", daemon=False)
        if rank == 0:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._remove_temporaries()

    # -- writing -------------------------------------------------------------------

    def save(self, state: dict[str, Any], *, epoch: int, step: int, samples_consumed: int = 0) -> None:
        """Stores ``state`` as the snapshot for (epoch, step); returns at once on other ranks.

        Raises:
            SnapshotError: the previous asynchronous save failed.
        """
        if self.rank != 0:
            return
        self.wait()
        meta = {"epoch": epoch, "step": step, "samples_consumed": samples_consumed}
        if not self.async_save:
            self._write(state, meta)
            return
        # Copy now: the training loop mutates parameters and optimizer state
        # in place while the writer thread is still serializing.
        cpu_state = to_cpu(state)
        self._saving.start(self._write, cpu_state, meta)

    def save_directory(self, source: str | os.PathLike, *, epoch: int, step: int, samples_consumed: int = 0) -> None:
        """Takes the checkpoint directory ``source`` in as the snapshot for (epoch, step) (rank 0;
        other ranks return at once). ``source`` is moved, not copied, when it is on the snapshot
        volume; it no longer exists afterwards.

        Raises:
            SnapshotError: ``source`` is missing or holds a link or special file (named).
        """
        if self.rank != 0:
            return
        self.wait()
        meta = {"epoch": epoch, "step": step, "samples_consumed": samples_consumed}
        stem = snapshot_stem(epoch, step)
        data_path = self.directory / f"{stem}{DIRECTORY_SUFFIX}"
        tmp = self.directory / f".{data_path.name}{_TMP_MARK}{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            take_in(Path(source), tmp)
            files = digest_tree(tmp)
        except (OSError, ValueError) as error:
            remove_tree(tmp)
            raise SnapshotError(f"cannot store checkpoint {source} as a snapshot: {error}") from error
        # The same (epoch, step) saved again, or a directory whose manifest never came: the manifest
        # goes first, so a crash in between leaves no manifest naming another tree.
        data_path.with_suffix(".json").unlink(missing_ok=True)
        remove_tree(data_path)
        os.rename(tmp, data_path)
        fsync_directory(self.directory)
        info = SnapshotInfo(path=str(data_path), time=_now(), sha256=tree_digest(files),
                            size=sum(size for _, _, size in files), files=files, **meta)
        self._complete(info, DIRECTORY_FORMAT_VERSION)

    def wait(self) -> None:
        """Blocks until a pending asynchronous save is complete; re-raises its error."""
        error = self._saving.wait()
        if error is not None:
            raise SnapshotError(f"asynchronous snapshot save to {self.directory} failed: {error}") from error

    def close(self) -> None:
        """Waits for a pending save (same as ``wait``)."""
        self.wait()

    def _write(self, state: dict[str, Any], meta: dict[str, int]) -> None:
        stem = snapshot_stem(meta["epoch"], meta["step"])
        data_path = self.directory / f"{stem}.pt"
        check = None if self.trusted else _refuse_unsafe_globals
        digest, size = _atomic_write(data_path, lambda handle: torch.save(state, handle), check)
        info = SnapshotInfo(path=str(data_path), time=_now(), sha256=digest, size=size, **meta)
        self._complete(info, FORMAT_VERSION)

    def _complete(self, info: SnapshotInfo, version: int) -> None:
        """Writes the manifest (which makes the snapshot count) and progress.json, prunes, reports."""
        manifest = {"format": version, "file": Path(info.path).name, **asdict(info)}
        del manifest["path"]
        if info.is_directory:
            manifest["files"] = [{"path": name, "sha256": digest, "size": size} for name, digest, size in info.files]
        else:
            del manifest["files"]
        _atomic_write(info.manifest_path, _json_writer(manifest))
        progress = {k: getattr(info, k) for k in ("epoch", "step", "time", "path", "samples_consumed")}
        _atomic_write(self.directory / PROGRESS_FILE, _json_writer(progress))
        log.info("snapshot complete: %s (epoch %d, step %d)", info.path, info.epoch, info.step)
        self._prune()
        if self.on_saved is not None:
            self.on_saved(info)

    def _prune(self) -> None:
        """Deletes complete snapshots beyond ``keep`` and orphaned data older than the newest one."""
        complete = self.complete()
        for old in complete[: -self.keep]:
            old.manifest_path.unlink(missing_ok=True)
            remove_tree(Path(old.path))
        if not complete:
            return
        # Data without a manifest, older than a complete snapshot: its writer
        # was killed and nothing will ever complete it.
        newest = _sort_key(Path(complete[-1].path))
        for data in self._data_paths():
            if _sort_key(data) < newest and not data.with_suffix(".json").exists():
                remove_tree(data)

    def _remove_temporaries(self) -> None:
        # Left by a writer that was killed; no writer runs while a new round starts.
        for leftover in self.directory.glob(f".*{_TMP_MARK}*"):
            remove_tree(leftover)

    def _data_paths(self) -> list[Path]:
        """Every snapshot's data, complete or not: .pt files and directory snapshots."""
        return [path for path in self.directory.glob("snapshot-*")
                if path.suffix in (".pt", DIRECTORY_SUFFIX) and _NAME.match(path.stem)]

    # -- reading -------------------------------------------------------------------

    def complete(self) -> list[SnapshotInfo]:
        """Snapshots whose manifest is in place, oldest first (data not verified)."""
        found, unreadable = self._scan()
        for manifest, problem in unreadable:
            _warn(f"snapshot manifest {manifest} is unreadable ({problem}); ignoring it")
        return found

    def latest(self) -> SnapshotInfo | None:
        """The newest snapshot whose data matches its manifest (not loaded), warning about each one skipped.

        Raises:
            SnapshotsUnreadableError: snapshots exist but none matches its manifest (``on_unreadable`` Fail).
        """
        return self._first_usable(lambda info: (_verify(info), None))[0]

    def load(self, info: SnapshotInfo, map_location: Any = None) -> dict[str, Any]:
        """Reads the state stored in ``info`` onto ``map_location`` (e.g. this rank's device).

        Raises:
            SnapshotError: the file cannot be read, or holds objects that ``weights_only`` refuses
                (the message says how to trust it).
        """
        problem, state = self._read(info, map_location)
        if problem is not None:
            raise SnapshotError(f"cannot load snapshot {info.path}: {problem}")
        return state

    def load_latest(self, map_location: Any = None) -> tuple[SnapshotInfo, dict[str, Any]] | None:
        """The newest snapshot that verifies and loads, and its state; None when there is none.

        Raises:
            SnapshotsUnreadableError: snapshots exist but none can be read (``on_unreadable`` Fail).
        """
        info, state = self._first_usable(lambda info: self._verified_read(info, map_location))
        return None if info is None else (info, state)

    def _verified_read(self, info: SnapshotInfo, map_location: Any) -> tuple[str | None, dict[str, Any] | None]:
        problem = _verify(info)
        return (problem, None) if problem is not None else self._read(info, map_location)

    def _first_usable(self, attempt: Callable[[SnapshotInfo], tuple[str | None, Any]]
                      ) -> tuple[SnapshotInfo | None, Any]:
        """Tries the snapshots newest first; the first one ``attempt`` finds no problem with, and its result."""
        found, unreadable = self._scan()
        rejected = [(str(manifest), f"its manifest is unreadable ({problem})") for manifest, problem in unreadable]
        for candidate in self._candidates_newest_first(found):
            if isinstance(candidate, Path):
                rejected.append((str(candidate), "it has no manifest (save was interrupted)"))
                continue
            problem, result = attempt(candidate)
            if problem is None:
                if rejected:
                    _warn(f"skipped snapshot(s) {_listing(rejected, '; ')}; using previous snapshot {candidate.path}")
                return candidate, result
            rejected.append((candidate.path, problem))
        if found or unreadable:  # an orphan alone is a first save that never completed: nothing to resume
            self._none_readable(rejected)
        elif rejected:
            _warn(f"no complete snapshot in {self.directory}; skipped {_listing(rejected, '; ')}")
        return None, None

    def _none_readable(self, rejected: list[tuple[str, str]]) -> None:
        """Snapshots exist, none is usable: raise, or with StartOver say that training starts from scratch."""
        if self.on_unreadable == "StartOver":
            _warn(f"no usable snapshot in {self.directory}; skipped {_listing(rejected, '; ')}; starting from "
                  f"scratch ({SNAPSHOT_ON_UNREADABLE_ENV}=StartOver)")
            return
        raise SnapshotsUnreadableError(
            f"none of the snapshots in {self.directory} can be read, and resuming without one would restart "
            f"training from step 0:\n  {_listing(rejected, chr(10) + '  ')}\nRepair or remove them; or, if they "
            f"are only refused by weights_only and every writer of the directory is trusted, set "
            f"{TRUST_SNAPSHOTS_ENV}=1; "
            f"or set spec.snapshot.onUnreadable: StartOver ({SNAPSHOT_ON_UNREADABLE_ENV}=StartOver) to train "
            f"from scratch")

    def _read(self, info: SnapshotInfo, map_location: Any) -> tuple[str | None, dict[str, Any] | None]:
        """(None, state), or (what is wrong, None) for a file that cannot be loaded."""
        if info.is_directory:
            return ("it is a directory snapshot (a framework's own checkpoint, save_directory): the framework "
                    "resumes from its path, e.g. Hugging Face's resume_from_checkpoint"), None
        try:
            return None, torch.load(info.path, map_location=map_location, weights_only=not self.trusted)
        except pickle.UnpicklingError as error:
            if self.trusted:
                return f"unpickling failed ({error})", None
            return _refused(error), None
        except Exception as error:  # noqa: BLE001 - torch reports corrupt archives as RuntimeError, EOFError...
            return f"torch.load failed ({type(error).__name__}: {_first_line(error)})", None

    def _scan(self) -> tuple[list[SnapshotInfo], list[tuple[Path, str]]]:
        """Readable manifests (oldest first) and the unreadable ones with why."""
        found, unreadable = [], []
        for manifest in self.directory.glob("snapshot-*.json"):
            if _NAME.match(manifest.stem) is None:
                continue
            try:
                found.append(_read_manifest(manifest))
            except (OSError, ValueError, KeyError, TypeError) as error:
                unreadable.append((manifest, str(error)))
        return sorted(found, key=lambda info: _sort_key(Path(info.path))), sorted(unreadable)

    def _candidates_newest_first(self, complete: list[SnapshotInfo]) -> list[SnapshotInfo | Path]:
        """Complete snapshots plus data files without a manifest that are newer than all of them."""
        newest_key = _sort_key(Path(complete[-1].path)) if complete else (-1, -1)
        orphans = [
            data for data in self._data_paths()
            if not data.with_suffix(".json").exists() and _sort_key(data) > newest_key
        ]
        merged: list[SnapshotInfo | Path] = [*complete, *orphans]
        merged.sort(key=lambda item: _sort_key(Path(item.path if isinstance(item, SnapshotInfo) else item)))
        return merged[::-1]


def to_cpu(value: Any) -> Any:
    """A deep copy of ``value`` with every tensor copied to CPU memory."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {key: to_cpu(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        copied = [to_cpu(item) for item in value]
        return type(value)(copied) if isinstance(value, list) else tuple(copied)
    return copy.deepcopy(value)


class _HashingWriter:
    """File wrapper that hashes bytes as they are written (no second read of a large file)."""

    def __init__(self, handle):
        self.handle = handle
        self.sha256 = hashlib.sha256()
        self.size = 0

    def write(self, data) -> int:
        self.sha256.update(data)
        self.size += len(data)
        return self.handle.write(data)

    def flush(self) -> None:
        self.handle.flush()


def _atomic_write(path: Path, write: Callable[[Any], None],
                  check: Callable[[Path], None] | None = None) -> tuple[str, int]:
    """Writes via a same-directory temporary file, fsync, rename, fsync of the directory.

    ``check`` may inspect the written temporary file and raise to keep it from replacing ``path``.
    """
    tmp = path.with_name(f".{path.name}{_TMP_MARK}{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        with open(tmp, "wb") as handle:
            writer = _HashingWriter(handle)
            write(writer)
            handle.flush()
            os.fsync(handle.fileno())
        if check is not None:
            check(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)
    return writer.sha256.hexdigest(), writer.size


def _json_writer(document: dict[str, Any]) -> Callable[[Any], None]:
    return lambda handle: handle.write(json.dumps(document, indent=1, sort_keys=True).encode() + b"\n")


def _read_manifest(manifest: Path) -> SnapshotInfo:
    document = json.loads(manifest.read_text())
    version = document.get("format")
    if version not in (FORMAT_VERSION, DIRECTORY_FORMAT_VERSION):
        raise ValueError(f"format {version!r} is not {FORMAT_VERSION} or {DIRECTORY_FORMAT_VERSION}")
    # The data is named like its manifest: a manifest cannot point pruning or loading elsewhere.
    data_name = f"{manifest.stem}{DIRECTORY_SUFFIX if version == DIRECTORY_FORMAT_VERSION else '.pt'}"
    if document["file"] != data_name:
        raise ValueError(f"file {document['file']!r} is not {data_name!r} (a manifest names its own data)")
    files = tuple((str(entry["path"]), str(entry["sha256"]), int(entry["size"]))
                  for entry in document["files"]) if version == DIRECTORY_FORMAT_VERSION else ()
    if version == DIRECTORY_FORMAT_VERSION and not files:
        raise ValueError("files is empty (a directory snapshot lists every file it holds)")
    outside = [name for name, _, _ in files if name.startswith("/") or ".." in name.split("/")]
    if outside:
        raise ValueError(f"files lists {outside[0]!r}: each path must be relative, inside the snapshot's directory")
    return SnapshotInfo(
        path=str(manifest.with_name(document["file"])),
        epoch=int(document["epoch"]),
        step=int(document["step"]),
        samples_consumed=int(document["samples_consumed"]),
        time=str(document["time"]),
        sha256=str(document["sha256"]),
        size=int(document["size"]),
        files=files,
    )


def _verify(info: SnapshotInfo) -> str | None:
    """None when the data (file or directory) matches the manifest, else what is wrong."""
    path = Path(info.path)
    if info.is_directory:
        return verify_tree(path, info.files)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return "its data file is missing"
    if size != info.size:
        return f"size {size} bytes does not match the manifest's {info.size}"
    if hash_file(path)[0] != info.sha256:
        return "sha256 does not match the manifest (corrupt data)"
    return None


def _refuse_unsafe_globals(path: Path) -> None:
    """Raises SnapshotError when the saved state holds objects that weights_only=True would refuse.

    Reads only the archive's pickle record (data.pkl), not the tensor data, so it costs
    little even for a large model.
    """
    unsafe = sorted(torch.serialization.get_unsafe_globals_in_checkpoint(str(path)))
    if unsafe:
        raise SnapshotError(
            f"the snapshot state holds objects that torch.load(weights_only=True) refuses to rebuild "
            f"({', '.join(unsafe)}), so it could not be resumed from: keep the state (the Trainer's extra "
            f"dict included) to tensors, numbers, strings, None and lists/tuples/dicts of them, or, if every "
            f"writer of the snapshot directory is trusted, set {TRUST_SNAPSHOTS_ENV}=1")


def _refused(error: pickle.UnpicklingError) -> str:
    """Why weights_only refused a file, in one line, with the way out."""
    match = re.search(r"WeightsUnpickler error: (.*?)(?: was not an allowed global|$)", str(error), re.MULTILINE)
    reason = match.group(1) if match else _first_line(error)
    return (f"torch.load(weights_only=True) refused it ({reason}): it holds Python objects other than tensors "
            f"and plain containers, as snapshots written before ddpjob stored its RNG states as tensors do; "
            f"{TRUST_SNAPSHOTS_ENV}=1 loads it with weights_only=False, which runs any code it holds")


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _listing(rejected: list[tuple[str, str]], separator: str) -> str:
    return separator.join(f"{name}: {problem}" for name, problem in rejected)


def _sort_key(data_path: Path) -> tuple[int, int]:
    match = _NAME.match(data_path.stem)
    return (int(match.group(1)), int(match.group(2))) if match else (-1, -1)


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def _warn(message: str) -> None:
    log.warning(message)
