"""A folder of wheels from which a clean venv installs the operator package without the network.

Filled once per constraints.txt, by `pip download` of what `pip install ./rdzv ./operator` needs
(setuptools, which builds our two packages, included) at the versions constraints.txt pins,
into a cache outside the clone ($DDPJOB_CACHE, default ~/.cache/ddpjob, where the control-plane
binaries live too). etcd3 is published as an sdist only; it is built into a wheel here, with
this environment's setuptools, so later installs need no build dependency of it. After that,
`pip install --no-index --find-links <wheelhouse>` runs offline.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONSTRAINTS = ROOT / "constraints.txt"
CACHE = Path(os.environ.get("DDPJOB_CACHE", Path.home() / ".cache" / "ddpjob"))
FETCH_TIMEOUT = 600  # a cold fetch is ~12 MB (grpcio the most); it took 98 s here on a loaded machine


class WheelhouseError(RuntimeError):
    """The wheelhouse could not be filled (no network on a first run, or a pin that has no wheel)."""


def wheelhouse() -> Path:
    """The folder of wheels for this constraints.txt, fetched on first use."""
    digest = hashlib.sha256(CONSTRAINTS.read_bytes()).hexdigest()[:16]
    done = CACHE / "wheels" / digest
    if (done / ".complete").exists():
        return done
    done.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=done.parent) as scratch:
        filling = Path(scratch) / "wheels"
        _pip("download", "-d", filling, "-c", CONSTRAINTS, "setuptools", ROOT / "rdzv", ROOT / "operator")
        for sdist in filling.glob("*.tar.gz"):
            _pip("wheel", "--no-deps", "--no-build-isolation", "-w", filling, sdist)
            sdist.unlink()
        (filling / ".complete").touch()
        shutil.rmtree(done, ignore_errors=True)
        filling.rename(done)  # whole or not at all: a second session never sees half of it
    return done


def _pip(*args: object) -> None:
    command = [sys.executable, "-m", "pip", "-q", *map(str, args)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=FETCH_TIMEOUT)
    if result.returncode != 0:
        raise WheelhouseError(f"{' '.join(command)} exited {result.returncode} (a first run needs the "
                              f"package index):\n{result.stderr[-2000:]}")
