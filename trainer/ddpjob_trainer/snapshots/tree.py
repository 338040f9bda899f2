"""A directory as one snapshot: a framework's own checkpoint held with a single file's guarantees.

Hugging Face's Trainer writes its checkpoint as a directory of files (weights, optimizer,
scheduler, one RNG file per rank, trainer_state.json) and resumes from that directory itself.
SnapshotStore keeps such a checkpoint beside its file snapshots::

    snapshot-s0000000120-e000003.d/       the checkpoint's files, as the framework wrote them
    snapshot-s0000000120-e000003.json     manifest (format 2): every file's relative path,
                                          sha256 and size, and one digest over that list

The rules are the file snapshot's, applied to a tree: the directory is taken in under a
temporary name, every file and directory in it is fsynced while it is hashed, the directory
is renamed into place, and the manifest is written last; a snapshot counts only when its
manifest exists and the tree matches it exactly: each listed file present with its size and
sha256, and no file the manifest does not list (a planted file would be loaded by the
framework as if it were part of the checkpoint). A writer killed at any point leaves a
temporary directory (removed at the next start) or a directory without a manifest (never
loaded), and the previous snapshot stands.

Why a tree and not an archive of it: the framework resumes from the directory in place, so
nothing is unpacked at resume, and taking the checkpoint in is a rename, not a copy, when it
was written on the snapshot volume (one read to hash it, no second write).
"""
from __future__ import annotations

import errno
import hashlib
import os
import shutil
import stat
from pathlib import Path

# (relative path with "/" separators, sha256 hex, size in bytes), sorted by path.
TreeFiles = tuple[tuple[str, str, int], ...]


def take_in(source: Path, destination: Path) -> None:
    """Moves the directory ``source`` to ``destination`` (a rename; a copy, then removal of the
    source, when the two are on different filesystems).

    Raises:
        ValueError: ``source`` is not a directory.
    """
    if not source.is_dir():
        raise ValueError(f"checkpoint directory {source} does not exist (or is not a directory)")
    try:
        os.rename(source, destination)
    except OSError as error:
        if error.errno != errno.EXDEV:
            raise
        shutil.copytree(source, destination, symlinks=True)  # links stay links: digest_tree refuses them
        shutil.rmtree(source)


def digest_tree(root: Path) -> TreeFiles:
    """Every regular file under ``root`` with its sha256 and size, each file and directory fsynced.

    Raises:
        ValueError: the tree holds a symbolic link or a special file (the snapshot would depend on
            something outside it), naming it.
    """
    found = []
    for directory, subdirectories, names in os.walk(root):
        subdirectories.sort()
        for name in sorted(names) + [d for d in subdirectories if Path(directory, d).is_symlink()]:
            path = Path(directory, name)
            mode = path.lstat().st_mode
            if not stat.S_ISREG(mode):
                kind = "a symbolic link" if stat.S_ISLNK(mode) else "not a regular file"
                raise ValueError(f"{path.relative_to(root)} in checkpoint {root.name} is {kind}: a snapshot "
                                 f"holds regular files only")
            digest, size = hash_file(path, sync=True)
            found.append((path.relative_to(root).as_posix(), digest, size))
        fsync_directory(Path(directory))
    return tuple(sorted(found))


def tree_digest(files: TreeFiles) -> str:
    """One sha256 over the listing: names the tree's exact content in the manifest."""
    listing = "".join(f"{digest}  {size}  {name}\n" for name, digest, size in files)
    return hashlib.sha256(listing.encode()).hexdigest()


def verify_tree(root: Path, files: TreeFiles) -> str | None:
    """None when the tree under ``root`` holds exactly ``files``, else what is wrong (first problem)."""
    if not root.is_dir():
        return "its data directory is missing"
    listed = {name: (digest, size) for name, digest, size in files}
    present = sorted(path.relative_to(root).as_posix() for path in root.rglob("*") if not path.is_dir()
                     or path.is_symlink())
    unlisted = [name for name in present if name not in listed]
    if unlisted:
        return f"it holds {', '.join(unlisted[:3])}, which its manifest does not list"
    for name, (digest, size) in listed.items():
        path = root / name
        if not path.is_file() or path.is_symlink():
            return f"{name} is missing"
        if path.stat().st_size != size:
            return f"{name}: size {path.stat().st_size} bytes does not match the manifest's {size}"
        if hash_file(path)[0] != digest:
            return f"{name}: sha256 does not match the manifest (corrupt data)"
    return None


def remove_tree(path: Path) -> None:
    """Removes a snapshot's directory (or a file, for a leftover of either kind); absent is fine."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def hash_file(path: Path, sync: bool = False) -> tuple[str, int]:
    """sha256 and size of the file at ``path``, read once; ``sync`` also fsyncs it."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
            size += len(block)
        if sync:  # the framework wrote it without fsync: durable before the manifest says it exists
            os.fsync(handle.fileno())
    return digest.hexdigest(), size


def fsync_directory(directory: Path) -> None:
    # A rename or a new file is durable only once its directory entry is on disk.
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
