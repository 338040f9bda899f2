"""RBAC as the API server applies it, for the emulator: what a request needs and whether Roles grant it.

A request becomes an RBAC attribute (verb, API group, resource with its
subresource, namespace), the way the API server's request-info resolver reads
the URL; a ServiceAccount's grants are the rules of the ClusterRoles bound to it
(everywhere) and of the Roles bound in a namespace (there only). The emulator's
``authorize`` hook takes a :class:`Authorizer`, so a test runs the real operator
with exactly the permissions a rendered chart gives it and sees the 403s a
cluster would answer.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlparse

# Requests from the test itself (urllib client, kubectl) are not the operator's.
TEST_AGENTS = ("Python-urllib", "kubectl")
RESOURCE_PATH = re.compile(
    r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
    r"(?:/namespaces/(?P<namespace>[^/]+))?/(?P<resource>[^/]+)(?:/(?P<name>[^/]+)(?:/(?P<sub>[^/]+))?)?$")

Grant = tuple[str, str, str]  # (verb, API group, resource), as one RBAC rule entry grants it


@dataclass(frozen=True)
class Access:
    """One request as RBAC sees it."""

    verb: str
    group: str
    resource: str  # with "/subresource" when there is one
    namespace: str | None  # None: cluster-scoped or across all namespaces
    name: str | None = field(default=None, compare=False)  # for the denial message only

    @property
    def grant(self) -> Grant:
        return (self.verb, self.group, self.resource)

    def __str__(self) -> str:
        where = f"in {self.namespace}" if self.namespace else "cluster-wide"
        return f"{self.verb} {self.group or 'core'}/{self.resource} {where}"


def access_of(method: str, url: str) -> Access | None:
    """RBAC attributes of a request; None for discovery and other non-resource URLs."""
    parsed = urlparse(url)
    match = RESOURCE_PATH.match(parsed.path)
    if match is None:
        return None
    named = match["name"] is not None
    resource = match["resource"] + (f"/{match['sub']}" if match["sub"] else "")
    return Access(_verb(method, named, parsed.query), match["group"] or "", resource, match["namespace"],
                  match["name"])


def _verb(method: str, named: bool, query: str) -> str:
    if method == "GET":
        return "get" if named else ("watch" if parse_qs(query).get("watch") == ["true"] else "list")
    return {"POST": "create", "PUT": "update", "PATCH": "patch",
            "DELETE": "delete" if named else "deletecollection"}[method]


def granted(rules: Iterable[Mapping]) -> set[Grant]:
    """Every (verb, group, resource) the rules of one (Cluster)Role grant."""
    return {(verb, group, resource) for rule in rules for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]}


@dataclass(frozen=True)
class Grants:
    """What one ServiceAccount may do: cluster-wide (ClusterRoles) and per namespace (Roles)."""

    cluster: frozenset[Grant] = frozenset()
    namespaced: Mapping[str, frozenset[Grant]] = field(default_factory=dict)

    def allows(self, access: Access) -> bool:
        if access.grant in self.cluster:
            return True
        return access.namespace is not None and access.grant in self.namespaced.get(access.namespace, frozenset())


def grants_of(objects: Iterable[Mapping]) -> Grants:
    """The grants of the ServiceAccount bound by rendered ClusterRoleBindings and RoleBindings."""
    objects = list(objects)
    roles = {(obj["kind"], obj["metadata"].get("namespace"), obj["metadata"]["name"]): granted(obj["rules"])
             for obj in objects if obj["kind"] in ("ClusterRole", "Role")}
    cluster: set[Grant] = set()
    namespaced: dict[str, set[Grant]] = {}
    for binding in objects:
        if binding["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        namespace = binding["metadata"].get("namespace")
        ref = binding["roleRef"]
        rules = roles[(ref["kind"], namespace if ref["kind"] == "Role" else None, ref["name"])]
        if binding["kind"] == "ClusterRoleBinding":
            cluster |= rules
        else:
            namespaced.setdefault(namespace, set()).update(rules)
    return Grants(frozenset(cluster), {ns: frozenset(g) for ns, g in namespaced.items()})


class Authorizer:
    """The emulator's ``authorize`` hook: refuses the operator's requests its grants do not allow.

    Requests from the test itself (``TEST_AGENTS``) act as a cluster admin. Refusals are
    recorded in ``denied`` and worded as the API server words them.
    """

    def __init__(self, grants: Grants, user: str = "system:serviceaccount:ddpjob-system:ddpjob-operator"):
        self.grants = grants
        self.user = user
        self.denied: list[Access] = []

    def __call__(self, request) -> str | None:
        if request.headers.get("User-Agent", "").startswith(TEST_AGENTS):
            return None
        access = access_of(str(request.method.value).upper(), str(request.url))
        if access is None or self.grants.allows(access):
            return None
        self.denied.append(access)
        return self.message(access)

    def message(self, access: Access) -> str:
        what = f'{access.resource.split("/")[0]} "{access.name}"' if access.name else access.resource.split("/")[0]
        where = f'in the namespace "{access.namespace}"' if access.namespace else "at the cluster scope"
        return (f'{what} is forbidden: User "{self.user}" cannot {access.verb} resource "{access.resource}" '
                f'in API group "{access.group}" {where}')
