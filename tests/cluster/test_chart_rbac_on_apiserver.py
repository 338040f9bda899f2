"""docs/install.md's permission table is exactly what the chart lets the operator do, and where, in
every RBAC mode, as the real API server's RBAC authorizer evaluates it.

The table has one row per (API group, resource): its verbs, where it lands with all namespaces and
with ``watchNamespaces`` (ClusterRole, Role, or — for nowhere), and the value it needs ("Only
with", e.g. ``rbac.readSecrets=true``). For each combination of the values that change RBAC, the
chart's ServiceAccount and RBAC objects (rendered as `helm template` does, a release of its own)
are created on the API server, and the server says what the ServiceAccount may do
(tests/cluster/rbac_review.py): in a namespace no Role can be in (its cluster-wide grants), in each
watched namespace (those plus the namespace's Role) and in the release's own namespace (nothing
more, unless watched). Both directions must equal what the table promises.
"""
from __future__ import annotations

import contextlib
import itertools
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from ddpjob_sandbox.client import ApiError, KubeClient
from ddpjob_sandbox.control_plane import ControlPlane
from tests.cluster.rbac_review import Grant, granted, review
from tests.charts.support import CHART_DIR, ROOT, render

pytestmark = pytest.mark.cluster

INSTALL_DOC = ROOT / "docs" / "install.md"
DEFAULTS = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
# The values that change what RBAC the chart renders, each on and off.
SWITCHES = ("watchNamespaces", "rbac.readSecrets", "rbac.readNodes", "peering.enabled")
# Where each object the chart grants with is created (the rest of the chart is not RBAC).
PATHS = {"ServiceAccount": "/api/v1/{ns}serviceaccounts",
         "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
         "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
         "Role": "/apis/rbac.authorization.k8s.io/v1/{ns}roles",
         "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/{ns}rolebindings"}
# A grant of a made-up resource, bound last of each kind (tests wait for it: see sentinels()).
SENTINEL_GROUP = "sentinel.ddpjob.io"
SENTINEL_GRANTS = {("get", SENTINEL_GROUP, "clustersentinels"), ("get", SENTINEL_GROUP, "sentinels")}


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


def with_switches(flags: tuple[bool, ...], watched: list[str]) -> dict:
    """Chart values for one combination of SWITCHES (the rest stays default)."""
    watch, secrets, nodes, peering = flags
    return {"watchNamespaces": watched if watch else [], "rbac": {"readSecrets": secrets, "readNodes": nodes},
            "peering": {"enabled": peering}}


def merged(values: dict) -> dict:
    result = {**DEFAULTS, **values}
    for key in ("rbac", "peering"):
        result[key] = {**DEFAULTS[key], **values.get(key, {})}
    return result


@dataclass
class Granted:
    """What the API server lets the release's ServiceAccount do."""

    cluster: set[Grant]  # in a namespace no Role is in
    namespaced: dict[str, set[Grant]] = field(default_factory=dict)  # beyond `cluster`, per watched namespace
    own_namespace: set[Grant] = field(default_factory=set)  # beyond `cluster`, in the release's namespace


def create(kube: KubeClient, obj: dict) -> None:
    namespace = obj["metadata"].get("namespace")
    kube.request("POST", PATHS[obj["kind"]].format(ns=f"namespaces/{namespace}/" if namespace else ""), obj)


def sentinels(release: str, namespace: str, account: str) -> list[dict]:
    """A ClusterRole, ClusterRoleBinding, Role and RoleBinding granting ``account`` a made-up
    resource each. The authorizer reads each kind from its own watch, in order: once it grants both
    sentinels, created after the chart's objects, it has read all of those."""
    subject = [{"kind": "ServiceAccount", "name": account.split(":")[3], "namespace": account.split(":")[2]}]
    group = "rbac.authorization.k8s.io/v1"
    name = f"{release}-sentinel"
    return [
        {"apiVersion": group, "kind": "ClusterRole", "metadata": {"name": name},
         "rules": [{"apiGroups": [SENTINEL_GROUP], "resources": ["clustersentinels"], "verbs": ["get"]}]},
        {"apiVersion": group, "kind": "ClusterRoleBinding", "metadata": {"name": name}, "subjects": subject,
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name}},
        {"apiVersion": group, "kind": "Role", "metadata": {"name": name, "namespace": namespace},
         "rules": [{"apiGroups": [SENTINEL_GROUP], "resources": ["sentinels"], "verbs": ["get"]}]},
        {"apiVersion": group, "kind": "RoleBinding", "metadata": {"name": name, "namespace": namespace},
         "subjects": subject, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}},
    ]


def without_sentinels(grants: set[Grant]) -> set[Grant]:
    return {grant for grant in grants if grant[1] != SENTINEL_GROUP}


@contextlib.contextmanager
def chart_rbac(control_plane: ControlPlane, flags: tuple[bool, ...]) -> Iterator[tuple[dict, Granted]]:
    """The chart's RBAC for one combination of SWITCHES created on the API server, in namespaces of
    its own; yields the values and what the server lets the ServiceAccount do. Removed after."""
    kube = control_plane.client()
    release = f"rbac-{uuid.uuid4().hex[:6]}"
    own, elsewhere = f"{release}-system", f"{release}-elsewhere"  # `elsewhere` is never created
    watched = [f"{release}-a", f"{release}-b"]
    values = with_switches(flags, watched)
    objects = [o for o in render(values, name=release, namespace=own) if o["kind"] in PATHS]
    namespaces = [own, *(watched if values["watchNamespaces"] else [])]
    (account_object,) = [o for o in objects if o["kind"] == "ServiceAccount"]
    account = f"system:serviceaccount:{own}:{account_object['metadata']['name']}"
    try:
        for namespace in namespaces:
            kube.create("namespaces", {"metadata": {"name": namespace}})
        for obj in [*objects, *sentinels(release, own, account)]:
            create(kube, obj)
        kube.wait_for(lambda: SENTINEL_GRANTS <= review(kube, account, own), timeout=30,
                      what="the API server's authorizer to read the chart's RBAC")
        cluster = without_sentinels(granted(kube, account, elsewhere))
        yield values, Granted(
            cluster=cluster,
            namespaced={ns: without_sentinels(granted(kube, account, ns)) - cluster
                        for ns in watched if values["watchNamespaces"]},
            own_namespace=without_sentinels(granted(kube, account, own)) - cluster)
    finally:  # the namespaces take their Roles and bindings with them; the cluster-scoped ones go by name
        for obj in [*objects, *sentinels(release, own, account)]:
            if obj["kind"] in ("ClusterRole", "ClusterRoleBinding"):
                with contextlib.suppress(ApiError):  # never created: a create before it failed
                    kube.request("DELETE", f"{PATHS[obj['kind']]}/{obj['metadata']['name']}")
        for namespace in namespaces:
            with contextlib.suppress(ApiError):
                kube.delete("namespaces", namespace)


COMBINATIONS = list(itertools.product([False, True], repeat=len(SWITCHES)))


@pytest.mark.parametrize("flags", COMBINATIONS,
                         ids=["-".join(f"{name}={'on' if on else 'off'}" for name, on in zip(SWITCHES, flags))
                              for flags in COMBINATIONS])
def test_the_docs_table_is_exactly_what_the_api_server_lets_the_operator_do(control_plane, flags):
    with chart_rbac(control_plane, flags) as (values, server):
        cluster, namespaced = promised(doc_rows(), merged(values))
        assert sorted(server.cluster) == sorted(cluster), "cluster-wide grants differ from docs/install.md"
        assert server.own_namespace == set(), "the release's own namespace gets grants the table does not list"
        for namespace, grants in server.namespaced.items():
            assert sorted(grants) == sorted(namespaced), f"the grants in {namespace} differ from docs/install.md"
        if not values["watchNamespaces"]:
            assert namespaced == set(), "the table promises Roles, but every namespace is watched by a ClusterRole"


def test_the_defaults_grant_no_secrets_and_reading_nodes_cluster_wide(control_plane):
    with chart_rbac(control_plane, (False, False, True, False)) as (_, server):
        assert ("get", "", "secrets") not in server.cluster and ("get", "", "nodes") in server.cluster


def test_secrets_are_granted_only_in_the_watched_namespaces_when_there_are_some(control_plane):
    with chart_rbac(control_plane, (True, True, True, False)) as (_, server):
        assert ("get", "", "secrets") not in server.cluster | server.own_namespace
        assert [("get", "", "secrets") in grants for grants in server.namespaced.values()] == [True, True]


def test_a_row_the_chart_does_not_grant_is_caught(control_plane):
    """The comparison is not vacuous: a docs table with a made-up grant disagrees with the server."""
    made_up = {"API group": "core", "Resource": "`configmaps`", "Verbs": "get", "All namespaces": "ClusterRole",
               "`watchNamespaces`": "Role", "Only with": ""}
    with chart_rbac(control_plane, (False, False, True, False)) as (values, server):
        cluster, _ = promised(doc_rows() + [made_up], merged(values))
        assert ("get", "", "configmaps") in cluster - server.cluster
