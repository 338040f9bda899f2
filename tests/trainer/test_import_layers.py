"""The trainer package's rooms depend one way, with no import circle, and the torch-free rooms stay torch-free.

Rooms, lowest first (ddpjob_trainer/__init__.py says what each holds):

    env, errors, listen, marks, stop, zygote_checks           the process and its settings
    <- dist, zygote, store_server, rdzv_store, rendezvous/,
       snapshots/, loop/                                       what a worker is made of
    <- report/                                                 what a node tells the operator
    <- job                                                     the one lifecycle: snapshots + report
    <- trainer                                                 the Trainer: the Job plus a loop
    <- integrations/                                           Lightning and Hugging Face on the Job
    <- examples/, __init__

snapshots/, report/ and loop/ never import one another: the Job wires the store to the report
and the metrics, once, for every loop. Every import counts (at module level, inside functions
and under TYPE_CHECKING alike), as in tests/operator/test_import_layers.py.
"""
from __future__ import annotations

import ast
import shutil
from functools import lru_cache
from pathlib import Path

import pytest

from tests.support import import_graph

PACKAGE = "ddpjob_trainer"
ROOT = Path(__file__).resolve().parents[2] / "trainer" / PACKAGE
ROOM_LEVEL = {
    "env": 0, "errors": 0, "listen": 0, "marks": 0, "stop": 0, "zygote_checks": 0,
    "dist": 1, "zygote": 1, "store_server": 1, "rdzv_store": 1, "rendezvous": 1, "snapshots": 1, "loop": 1,
    "report": 2,
    "job": 3,
    "trainer": 4,
    "integrations": 5,
    "examples": 6, "__init__": 6,
}
# Rooms on one floor that must not know each other: the Job is where they meet.
INDEPENDENT_ROOMS = {(a, b) for a in ("snapshots", "report", "loop") for b in ("snapshots", "report", "loop") if a != b}
# Imported by the operator's `ddpjob run` (report/metrics.py) or by a script before anything heavy
# (errors, do_not_retry, TrainerConfig): no torch at import time, and only torch-free modules of ours.
TORCH_FREE = {"env", "errors", "listen", "marks", "stop", "zygote", "zygote_checks", "report", "loop.config"}
# The longest chain of imports inside the package, 8 modules, is the example's through the public
# facade down the lifecycle: examples/mlp -> __init__ -> trainer -> job -> report.give_up ->
# report.record -> report.server -> listen. Each step is a floor of its own (the Trainer is a loop
# on the Job; the Job gives up through the report; the record is served by the server, which
# binds where listen says); the rendezvous handler's chain is 7. Before the rooms the package had
# 9 floors and a circle (errors <-> progress_report), so it had no longest chain at all.
LONGEST_CHAIN_ALLOWED = 8


def module_name(path: Path, root: Path) -> str:
    return ".".join(path.relative_to(root).with_suffix("").parts)


def product_modules(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if p.name != "__init__.py" or p.parent != root) + [root / "__init__.py"]


def imports_of(path: Path, root: Path) -> list[tuple[str, int]]:
    """(absolute dotted module, line) of every import in the file, wherever it stands."""
    tree = ast.parse(path.read_text(), filename=str(path))
    own = [PACKAGE, *module_name(path, root).split(".")][:-1]  # the package the file is in
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(own[:len(own) - node.level + 1] + ([node.module] if node.module else []))
            # `from ddpjob_trainer.snapshots import store` imports the module snapshots.store (and
            # the package's __init__, unless it is the package's top: `from . import marks`)
            modules = [f"{base}.{alias.name}" for alias in node.names if _is_module(root, f"{base}.{alias.name}")]
            if base != PACKAGE or len(modules) < len(node.names):
                found.append((base, node.lineno))
            found += [(module, node.lineno) for module in modules]
    return found


def _is_module(root: Path, dotted: str) -> bool:
    path = root.parent / dotted.replace(".", "/")
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def internal(target: str) -> str | None:
    """The module below the package an import names (None when outside it)."""
    if target == PACKAGE:
        return "__init__"
    if not target.startswith(PACKAGE + "."):
        return None
    return target[len(PACKAGE) + 1:]


def room(module: str) -> str:
    return module.split(".")[0]


@lru_cache(maxsize=None)
def graph_of(root: Path) -> dict[str, tuple[tuple[str, int], ...]]:
    """Every module of the package and the modules it imports: (internal name or outside name, line)."""
    return {module_name(p, root) if p != root / "__init__.py" else "__init__": tuple(imports_of(p, root))
            for p in product_modules(root)}


def edges(root: Path) -> dict[str, set[str]]:
    graph = graph_of(root)
    found = {}
    for source, imports in graph.items():
        targets = {internal(t) for t, _ in imports} - {None}
        # `from ddpjob_trainer.report import record` also names the room's package: its __init__.
        found[source] = {t if t in graph else f"{t}.__init__" for t in targets} & set(graph) - {source}
    return found


def violations(root: Path = ROOT) -> list[str]:
    found = []
    for source, imports in graph_of(root).items():
        for target, line in imports:
            where = f"{source}:{line} imports {target}"
            inner = internal(target)
            if inner is None:
                if target.split(".")[0] == "torch" and _torch_free(source) and line in _top_level(source, root):
                    found.append(f"{where}: {source} must stay torch-free")
                continue
            src_room, dst_room = room(source), room(inner)
            if src_room not in ROOM_LEVEL:
                found.append(f"{where}: {src_room} is in no room of ROOM_LEVEL")
            elif dst_room not in ROOM_LEVEL:
                found.append(f"{where}: {dst_room} is in no room of ROOM_LEVEL")
            elif ROOM_LEVEL[dst_room] > ROOM_LEVEL[src_room]:
                found.append(f"{where}: {src_room} is below {dst_room}")
            elif (src_room, dst_room) in INDEPENDENT_ROOMS:
                found.append(f"{where}: {src_room}/ and {dst_room}/ meet only in the Job")
            elif _torch_free(source) and not _torch_free(inner) and inner != "__init__":
                found.append(f"{where}: {source} must stay torch-free, and {inner} is not")
    return found


@lru_cache(maxsize=None)
def _top_level(module: str, root: Path) -> frozenset[int]:
    """The lines of the module's imports that run when it is imported (a function may import torch
    when called: listen.tcp_store_server, the TensorBoard sink)."""
    path = root / ("__init__.py" if module == "__init__" else module.replace(".", "/") + ".py")
    tree = ast.parse(path.read_text())
    return frozenset(node.lineno for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom)))


def _torch_free(module: str) -> bool:
    return room(module) in TORCH_FREE or module in TORCH_FREE


def circles(root: Path = ROOT) -> list[list[str]]:
    """Every import circle among the package's modules (Tarjan's strongly connected components)."""
    graph = edges(root)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in graph:
                continue
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def longest_chain(root: Path = ROOT) -> list[str]:
    return import_graph.longest_chain(
        {m: sorted(t for t in targets if t in edges(root)) for m, targets in edges(root).items()})


def test_the_trainer_rooms_depend_one_way_and_the_torch_free_rooms_stay_torch_free():
    assert violations() == []


def test_the_trainer_has_no_import_circle():
    assert circles() == []


def test_the_trainer_longest_import_chain_stays_short():
    assert circles() == [], "a circle has no longest chain"
    chain = longest_chain()
    assert len(chain) <= LONGEST_CHAIN_ALLOWED, " -> ".join(chain)


def planted(tmp_path: Path, source: str, body: str) -> Path:
    """A copy of the package with ``body`` appended to ``source``."""
    copy = tmp_path / PACKAGE
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    with open(copy / source, "a") as file:
        file.write(body)
    graph_of.cache_clear()
    _top_level.cache_clear()
    return copy


@pytest.mark.parametrize("source, body, complaint", [
    ("loop/rng.py", "\ndef f():\n    from ddpjob_trainer.snapshots import store\n", "meet only in the Job"),
    ("report/record.py", "\nfrom ddpjob_trainer import job\n", "report is below job"),
    ("job.py", "\nfrom ddpjob_trainer.trainer import Trainer\n", "job is below trainer"),
    ("report/metrics.py", "\nimport torch\n", "must stay torch-free"),
    ("errors.py", "\nfrom ddpjob_trainer.snapshots.store import SnapshotStore\n", "errors is below snapshots"),
])
def test_the_layer_check_catches(tmp_path, source, body, complaint):
    """Each rule fires on a planted import (a copy of the package with one file extended)."""
    try:
        assert any(complaint in v for v in violations(planted(tmp_path, source, body)))
    finally:
        graph_of.cache_clear()
        _top_level.cache_clear()


def test_the_circle_check_catches_the_old_errors_and_report_circle(tmp_path):
    body = "\ndef do_not_retry():\n    from ddpjob_trainer.report.give_up import give_up\n"
    try:
        assert any({"errors", "report.give_up"} <= set(circle) for circle in circles(planted(tmp_path, "errors.py", body)))
    finally:
        graph_of.cache_clear()
        _top_level.cache_clear()
