"""The operator distribution declares what it imports, and the command line stays light.

`ddpjob validate|render` on a laptop must not pull kopf, aiohttp or prometheus (the
operator process's [controller] extra), and the operator image need not install the
trainer (`ddpjob run`'s [local] extra).
"""
from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "operator" / "ddpjob_operator"
EXAMPLE = ROOT / "manifests" / "examples" / "ddpjob-c10d.yaml"
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
