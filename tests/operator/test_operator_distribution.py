"""The operator distribution declares what it imports, and the command line stays light.

`ddpjob validate|render` on a laptop must not pull kopf, aiohttp or prometheus (the
operator process's [controller] extra), and the operator image need not install the
trainer (`ddpjob run`'s [local] extra). And `pip install ./rdzv ./operator` into a clean venv
gives both commands with no torch anywhere (from a wheelhouse, offline: tests/support/wheelhouse.py).
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
import tomllib
import venv
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

from tests.support.wheelhouse import CONSTRAINTS, wheelhouse

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "operator" / "ddpjob_operator"
EXAMPLE = ROOT / "manifests" / "examples" / "ddpjob-c10d.yaml"
INVALID = ROOT / "tests" / "operator" / "corpus" / "replicas-above-max.yaml"
CONTROLLER_ONLY = ("kopf", "aiohttp", "prometheus_client")


def declared() -> dict[str | None, set[str]]:
    """Distributions operator/pyproject.toml requires: None for the base, else by extra.

    Read from the source tree, not the installed metadata: an editable install keeps the
    metadata of the day it was installed, so a new extra would be invisible until reinstalled.
    """
    project = tomllib.loads((ROOT / "operator" / "pyproject.toml").read_text())["project"]
    lists = {None: project.get("dependencies", []), **project.get("optional-dependencies", {})}
    return {extra: {Requirement(text).name.lower().replace("_", "-") for text in texts}
            for extra, texts in lists.items()}


def imported_by(place: Path) -> set[str]:
    """Top-level modules imported anywhere in a file or under a folder (in functions too)."""
    names = set()
    for path in place.rglob("*.py") if place.is_dir() else [place]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {"ddpjob_operator", "__future__"}


def distributions_of(modules: set[str]) -> set[str]:
    owners = packages_distributions()
    return {owners[m][0].lower().replace("_", "-") for m in modules}


def test_every_third_party_import_is_declared_in_the_room_that_needs_it():
    extras = declared()
    # local/ may import the plot extra: `ddpjob run` draws its timeline only when it is installed.
    rooms = {"controller": extras["controller"] | extras[None],
             "local": extras["local"] | extras["plot"] | extras[None]}
    for room, allowed in rooms.items():
        missing = distributions_of(imported_by(PACKAGE / room)) - allowed
        assert not missing, f"{room}/ imports {missing}, not declared for it in operator/pyproject.toml"
    rest = {p for p in PACKAGE.iterdir() if p.name not in rooms and p.name != "__pycache__"}
    base = set().union(*(imported_by(p) for p in rest))
    assert distributions_of(base) <= extras[None]


def test_the_base_install_needs_neither_the_operator_process_nor_torch():
    extras = declared()
    assert not {"kopf", "aiohttp", "prometheus-client", "torch", "ddpjob-trainer"} & extras[None]
    assert {"kopf", "aiohttp", "prometheus-client"} <= extras["controller"]


def test_the_plotting_library_is_only_an_extra():
    """`ddpjob run` never needs matplotlib: without the plot extra it writes the timeline data only."""
    extras = declared()
    assert "matplotlib" in extras["plot"]
    assert "matplotlib" not in extras[None] | extras["local"] | extras["controller"]


def test_ddpjob_validate_and_render_run_without_the_controller_libraries():
    """With kopf, aiohttp and prometheus_client made unimportable, the command line still works."""
    block = "; ".join(f"sys.modules[{name!r}] = None" for name in CONTROLLER_ONLY)
    for verb in ("validate", "render"):
        code = f"import sys; {block}; from ddpjob_operator.cli import main; sys.exit(main([{verb!r}, {str(EXAMPLE)!r}]))"
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr


def run_in(venv_dir: Path, *command: str, cwd: Path) -> subprocess.CompletedProcess:
    """A command of the venv, outside the clone and with no PYTHONPATH: only what pip installed."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv_dir / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=cwd, env=env)


@pytest.mark.slow  # ~2.5 min here (pip builds both packages), of which ~14 s CPU; load average 17
@pytest.mark.timeout(600)  # the first run also fetches the wheelhouse (~12 MB, 98 s here)
def test_pip_install_of_the_operator_alone_gives_validate_and_render_without_torch(tmp_path):
    """What README's install line does, offline: `pip install ./rdzv ./operator` into a fresh venv."""
    venv_dir, outside = tmp_path / "venv", tmp_path / "elsewhere"
    outside.mkdir()
    venv.create(venv_dir, with_pip=True)
    install = run_in(venv_dir, "python", "-m", "pip", "install", "-q", "--no-index", "--find-links",
                     str(wheelhouse()), "-c", str(CONSTRAINTS), str(ROOT / "rdzv"), str(ROOT / "operator"),
                     cwd=outside)
    assert install.returncode == 0, install.stderr

    where = run_in(venv_dir, "python", "-c", "import importlib.util as u, ddpjob_operator; print(ddpjob_operator.__file__); "
                   "print([m for m in ('torch', 'ddpjob_trainer', 'kopf') if u.find_spec(m)])", cwd=outside)
    assert where.stdout.splitlines()[0].startswith(str(venv_dir)), where.stdout  # the installed copy, not the clone's
    assert where.stdout.splitlines()[1] == "[]", "torch, the trainer and kopf are not installed"

    valid = run_in(venv_dir, "ddpjob", "validate", str(EXAMPLE), cwd=outside)
    assert (valid.returncode, valid.stdout) == (0, f"{EXAMPLE}: valid\n"), valid.stderr
    invalid = run_in(venv_dir, "ddpjob", "validate", str(INVALID), cwd=outside)
    assert invalid.returncode == 1
    assert "spec.replicas (5) must be <= spec.elasticPolicy.maxReplicas (4)" in invalid.stdout + invalid.stderr

    rendered = run_in(venv_dir, "ddpjob", "render", str(EXAMPLE), cwd=outside)
    assert rendered.returncode == 0, rendered.stderr
    here = subprocess.run([sys.executable, "-c", f"import sys; from ddpjob_operator.cli import main; "
                           f"sys.exit(main(['render', {str(EXAMPLE)!r}]))"], capture_output=True, text=True,
                          timeout=60)
    assert rendered.stdout == here.stdout, "the installed render differs from the clone's"
    kinds = [doc["kind"] for doc in yaml.safe_load_all(rendered.stdout) if doc]
    assert "Pod" in kinds and "Service" in kinds, kinds
