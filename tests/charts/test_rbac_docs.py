"""docs/install.md's permission table is exactly what the chart grants, and where, in every RBAC mode.

The table has one row per (API group, resource): its verbs, where it lands
with all namespaces and with ``watchNamespaces`` (ClusterRole, Role, or — for
nowhere), and the value it needs ("Only with", e.g. ``rbac.readSecrets=true``).
Each combination of the values that change RBAC is rendered, and the grants of
the ServiceAccount (tests/support/rbac.py reads the bindings) must equal what
the table promises, in both directions.
"""
from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest
import yaml

from tests.charts.support import CHART_DIR, ROOT, by_kind, render
from tests.support.rbac import Grant, grants_of

INSTALL_DOC = ROOT / "docs" / "install.md"
WATCHED = ["team-a", "team-b"]
DEFAULTS = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
# The values that change what RBAC the chart renders, each on and off.
SWITCHES = ("watchNamespaces", "rbac.readSecrets", "rbac.readNodes", "peering.enabled")


def doc_rows(path: Path = INSTALL_DOC) -> list[dict[str, str]]:
    """The rows of the table under '## Permissions' whose header starts with 'API group'."""
    section = path.read_text().split("## Permissions", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert header[:6] == ["API group", "Resource", "Verbs", "All namespaces", "`watchNamespaces`", "Only with"], header
    return [dict(zip(header, (cell.strip() for cell in line.strip("|").split("|")))) for line in lines[2:]]


def unquote(cell: str) -> str:
    return cell.strip("`")


def condition_holds(cell: str, values: dict) -> bool:
    """An empty cell always holds; '`a.b=true` (default)' holds when that value is true."""
    if not cell:
        return True
    match = re.fullmatch(r"`([\w.]+)=true`(?: \(default\))?", cell)
    assert match, f"docs/install.md: cannot read the 'Only with' cell {cell!r}"
    node = values
    for part in match[1].split("."):
        node = node[part]
    return node is True


def promised(rows: list[dict[str, str]], values: dict) -> tuple[set[Grant], set[Grant]]:
    """(cluster-wide grants, grants in each watched namespace) the table promises for ``values``."""
    column = "`watchNamespaces`" if values["watchNamespaces"] else "All namespaces"
    cluster, namespaced = set(), set()
    for row in rows:
        if not condition_holds(row["Only with"], values):
            continue
        group = "" if row["API group"] == "core" else unquote(row["API group"])
        grants = {(verb.strip(), group, unquote(row["Resource"])) for verb in row["Verbs"].split(",")}
        where = {"ClusterRole": cluster, "Role": namespaced, "—": None}[row[column]]
        if where is not None:
            where |= grants
    return cluster, namespaced


def with_switches(flags: tuple[bool, ...]) -> dict:
    """Chart values for one combination of SWITCHES (the rest stays default)."""
    watch, secrets, nodes, peering = flags
    return {"watchNamespaces": WATCHED if watch else [], "rbac": {"readSecrets": secrets, "readNodes": nodes},
            "peering": {"enabled": peering}}


def merged(values: dict) -> dict:
    result = {**DEFAULTS, **values}
    for key in ("rbac", "peering"):
        result[key] = {**DEFAULTS[key], **values.get(key, {})}
    return result


COMBINATIONS = list(itertools.product([False, True], repeat=len(SWITCHES)))


@pytest.mark.parametrize("flags", COMBINATIONS,
                         ids=["-".join(f"{name}={'on' if on else 'off'}" for name, on in zip(SWITCHES, flags))
                              for flags in COMBINATIONS])
def test_the_docs_table_is_exactly_what_the_chart_grants(flags):
    values = with_switches(flags)
    grants = grants_of(render(values))
    cluster, namespaced = promised(doc_rows(), merged(values))
    assert sorted(grants.cluster) == sorted(cluster), "cluster-wide grants differ from docs/install.md"
    expected_namespaces = WATCHED if values["watchNamespaces"] else []
    assert sorted(grants.namespaced) == expected_namespaces
    for namespace in expected_namespaces:
        assert sorted(grants.namespaced[namespace]) == sorted(namespaced), f"Role in {namespace} differs from the docs"


def test_the_defaults_grant_no_secrets_and_reading_nodes_cluster_wide():
    grants = grants_of(render())
    assert ("get", "", "secrets") not in grants.cluster and ("get", "", "nodes") in grants.cluster


def test_secrets_are_granted_only_in_the_watched_namespaces_when_there_are_some():
    grants = grants_of(render({"watchNamespaces": WATCHED, "rbac": {"readSecrets": True}}))
    assert ("get", "", "secrets") not in grants.cluster
    assert all(("get", "", "secrets") in grants.namespaced[ns] for ns in WATCHED)


def test_watched_namespaces_without_node_reads_leave_nothing_cluster_scoped():
    objects = render({"watchNamespaces": WATCHED, "rbac": {"readNodes": False}, "peering": {"enabled": True}})
    assert by_kind(objects, "ClusterRole") == [] and by_kind(objects, "ClusterRoleBinding") == []
    assert grants_of(objects).cluster == frozenset()


def test_a_row_the_chart_does_not_grant_is_caught():
    """The comparison is not vacuous: a docs table with a made-up grant disagrees with the chart."""
    made_up = {"API group": "core", "Resource": "`configmaps`", "Verbs": "get", "All namespaces": "ClusterRole",
               "`watchNamespaces`": "Role", "Only with": ""}
    rows = doc_rows() + [made_up]
    cluster, _ = promised(rows, merged(with_switches((False, False, True, False))))
    assert ("get", "", "configmaps") in cluster - grants_of(render()).cluster
