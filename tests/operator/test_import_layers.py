"""The operator package's rooms depend one way, and only the I/O room talks to the cluster.

Rooms, lowest first (ddpjob_operator/__init__.py says what each holds):

    api  <-  render  <-  decide  <-  controller | local  <-  cli, __main__

A module may import its own room and the rooms below it, never one above; controller
(the cluster executor) and local (`ddpjob run`, the local executor) never import each
other. Inside a room, policy modules import the room's shared modules, never a sibling
policy. kopf, aiohttp, prometheus_client and the Kubernetes client are imported only
in controller/. Every import counts: at module level, inside functions and under
TYPE_CHECKING alike.
"""
from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

import pytest

from tests.support import import_graph

PACKAGE = "ddpjob_operator"
ROOT = Path(__file__).resolve().parents[2] / "operator" / PACKAGE
ROOM_LEVEL = {"api": 0, "render": 1, "decide": 2, "controller": 3, "local": 3, "cli": 4, "__main__": 4,
              "__init__": 4}
INDEPENDENT_ROOMS = {("controller", "local"), ("local", "controller")}
IO_ONLY = ("kopf", "aiohttp", "prometheus_client", "kubernetes", "kubernetes_asyncio")
# Inside a room: shared modules (types and rules every policy may use), then the policies
# (which never import one another), then the modules that compose policies into one pass.
ROOM_TIERS = {
    "render": [{"common", "launch", "kueue", "preflight"}, {"node_pod", "store_pod", "etcd_pod", "network_policy", "pdb"},
               {"objects"}],
    "decide": [{"actions", "observed", "failure", "budget", "conditions", "creation", "bounds", "phases",
                "spares"},
               {"capacity", "topology", "progress", "stuck", "managed_etcd", "last_valid", "avoided_nodes", "hang",
                "straggler", "isolation", "rendezvous_keys"},
               {"plan", "status", "observation"}, {"reconcile"}],
}
# Modules on the longest import chain inside the package (14 before the rooms, then 9). 11 since
# the controller only executes: kopf's registrations (handlers) sit above the pass (job_pass) instead
# of running it themselves, and render/objects.py, the one list of a job's objects that the plan
# and `ddpjob render` share, sits above the renderers of each object.
LONGEST_CHAIN_ALLOWED = 11


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def product_modules() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py") if p.name != "__init__.py" or p.parent != ROOT)


@lru_cache(maxsize=None)
def imports_of(path: Path) -> tuple[tuple[str, int], ...]:
    """(absolute dotted module, line) of every import in the file, wherever it stands."""
    tree = ast.parse(path.read_text(), filename=str(path))
    own = [PACKAGE, *module_name(path).split(".")]
    if path.name != "__init__.py":
        own = own[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(own[:len(own) - node.level + 1] + ([node.module] if node.module else []))
            found.append((base, node.lineno))
            # `from ddpjob_operator.decide import plan` imports the module decide.plan
            found += [(f"{base}.{alias.name}", node.lineno) for alias in node.names
                      if (ROOT.parent / f"{base}.{alias.name}".replace(".", "/")).with_suffix(".py").exists()]
    return tuple(found)


def internal(target: str) -> str | None:
    """The module below the package an import names (None when outside it)."""
    if target == PACKAGE or not target.startswith(PACKAGE + "."):
        return None
    return target[len(PACKAGE) + 1:]


def room(module: str) -> str:
    return module.split(".")[0]


def tier(module: str) -> int | None:
    parts = module.split(".")
    for level, members in enumerate(ROOM_TIERS.get(parts[0], [])):
        if len(parts) > 1 and parts[1] in members:
            return level
    return None


def violations() -> list[str]:
    found = []
    for path in product_modules():
        source = module_name(path)
        for target, line in imports_of(path):
            where = f"{path.relative_to(ROOT.parent)}:{line} imports {target}"
            if target.split(".")[0] in IO_ONLY and room(source) != "controller":
                found.append(f"{where}: cluster I/O libraries belong in controller/")
            inner = internal(target)
            if inner is None or "." not in inner or room(inner) not in ROOM_LEVEL:
                continue  # outside the package, or a room's package itself (its module is checked)
            src_room, dst_room = room(source), room(inner)
            if ROOM_LEVEL[dst_room] > ROOM_LEVEL[src_room]:
                found.append(f"{where}: {src_room}/ is below {dst_room}/")
            elif (src_room, dst_room) in INDEPENDENT_ROOMS:
                found.append(f"{where}: {src_room}/ and {dst_room}/ are independent executors")
            elif src_room == dst_room and src_room in ROOM_TIERS:
                mine, theirs = tier(source), tier(inner)
                if mine is None or theirs is None:
                    found.append(f"{where}: every module of {src_room}/ must be listed in ROOM_TIERS")
                elif theirs >= mine and inner != source and mine > 0:
                    found.append(f"{where}: a {src_room}/ module imports only lower tiers, not a sibling")
    return found


def longest_chain() -> list[str]:
    graph = {module_name(p): sorted({internal(t) for t, _ in imports_of(p) if internal(t)} - {module_name(p)})
             for p in product_modules()}
    return import_graph.longest_chain({m: [t for t in targets if t in graph] for m, targets in graph.items()})


def test_rooms_depend_one_way_and_only_the_controller_does_cluster_io():
    assert violations() == []


def test_the_longest_import_chain_stays_short():
    chain = longest_chain()
    assert len(chain) <= LONGEST_CHAIN_ALLOWED, " -> ".join(chain)


@pytest.mark.parametrize("source, body, complaint", [
    ("render/node_pod.py", "from ddpjob_operator.decide import plan\n", "render/ is below decide/"),
    ("decide/plan.py", "def f():\n    import kopf\n", "cluster I/O libraries belong in controller/"),
    ("local/runner.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                        "    from ddpjob_operator.controller import kube\n", "independent executors"),
    ("decide/topology.py", "from ddpjob_operator.decide.capacity import overdue\n", "not a sibling"),
])
def test_the_layer_check_catches(tmp_path, monkeypatch, source, body, complaint):
    """Each rule fires on a planted import (a copy of the package with one file rewritten)."""
    import shutil

    copy = tmp_path / PACKAGE
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / source).write_text(body)
    monkeypatch.setattr(__import__(__name__, fromlist=["ROOT"]), "ROOT", copy)
    imports_of.cache_clear()
    try:
        assert any(complaint in v for v in violations())
    finally:
        imports_of.cache_clear()
