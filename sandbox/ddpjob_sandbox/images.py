"""Container images as local Python environments: what a sandbox node runs for a pod's ``image``.

There is no container runtime here, so an image is a Python environment: its ``bin/`` holds
the ``python`` and ``torchrun`` a container's command names. By default every image is this
interpreter's own environment (ddpjob installed); a node can map an image name to another one
(node.launch.container_launch ``images``).

:func:`torch_only_env` builds the environment of a plain PyTorch image, the kind a user brings:
torch and everything else installed here, but no ddpjob distribution. It is a virtualenv whose
site-packages links each top-level entry of this environment's, except ddpjob's packages, their
metadata and their editable-install hooks: seconds to make, nothing copied, and as honest as a
fresh ``pip install torch`` for what matters (``import ddpjob_trainer`` fails; torchrun knows no
rendezvous backend of ddpjob, whose entry points live in the metadata left out).
"""
from __future__ import annotations

import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

# Names in site-packages that belong to ddpjob's distributions: the packages, their dist-info,
# and the editable installs' .pth hooks and finder modules (``__editable__...ddpjob_...``).
DDPJOB_MARKERS = ("ddpjob",)
# Bytecode caches are left out too: a link would let the new environment write into this one's.
SKIPPED_NAMES = ("__pycache__",)
TORCHRUN = """#!{python}
# torchrun as pip installs it (torch's console script), for this environment's Python.
import sys
from torch.distributed.run import main
sys.exit(main())
"""


class ImageEnvError(RuntimeError):
    """The environment could not be made, or it is not what it claims to be."""


def site_packages(prefix: Path) -> Path:
    """The site-packages directory of the environment at ``prefix``."""
    return Path(sysconfig.get_path("purelib", vars={"base": str(prefix), "platbase": str(prefix)}))


def is_ddpjob_entry(path: Path) -> bool:
    """Whether a site-packages entry is (or hooks in) a ddpjob distribution."""
    if any(marker in path.name.lower() for marker in DDPJOB_MARKERS):
        return True
    # A .pth file runs its import lines at start-up: one naming ddpjob would bring it back.
    return path.suffix == ".pth" and any(m in path.read_text(errors="replace").lower() for m in DDPJOB_MARKERS)


def torch_only_env(dest: Path, source_prefix: Path = Path(sys.prefix)) -> Path:
    """A virtualenv at ``dest`` with every package of ``source_prefix``'s environment except
    ddpjob's (see the module docstring); checked before it is returned.

    Raises:
        ImageEnvError: the result can import ddpjob_trainer or cannot import torch.
    """
    dest = Path(dest)
    venv.EnvBuilder(with_pip=False, symlinks=True, clear=True).create(dest)
    target = site_packages(dest)
    for entry in sorted(site_packages(source_prefix).iterdir()):
        if entry.name in SKIPPED_NAMES or is_ddpjob_entry(entry):
            continue
        (target / entry.name).symlink_to(entry)
    torchrun = dest / "bin" / "torchrun"
    torchrun.write_text(TORCHRUN.format(python=dest / "bin" / "python"))
    torchrun.chmod(0o755)
    check_torch_only(dest)
    return dest


def check_torch_only(prefix: Path) -> None:
    """Raises ImageEnvError unless the environment imports torch and not ddpjob_trainer (run as a
    pod's container runs it: no PYTHONPATH from this machine)."""
    probe = ("import importlib.util as u, torch; "
             "print(','.join(m for m in ('ddpjob_trainer', 'ddpjob_rdzv', 'ddpjob_operator') if u.find_spec(m)))")
    done = subprocess.run([str(prefix / "bin" / "python"), "-c", probe], capture_output=True, text=True,
                          timeout=120, env={"PATH": "/usr/bin:/bin"})
    if done.returncode != 0:
        raise ImageEnvError(f"{prefix}: torch does not import: {done.stderr[-2000:]}")
    if done.stdout.strip():
        raise ImageEnvError(f"{prefix}: ddpjob packages importable: {done.stdout.strip()}")
