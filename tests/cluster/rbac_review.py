"""What a user may do, as the real API server's RBAC authorizer evaluates it.

A SelfSubjectRulesReview asked as that user (the admin impersonating it, as `kubectl auth can-i
--list --as=USER` does) lists the rules of every ClusterRole bound to it and of every Role bound to
it in the namespace asked about; :func:`rules_of` expands them to grants, so a test compares what
the server allows, not the Role objects a template wrote. Every authenticated user holds a few
grants of its own (``system:basic-user``: reviewing its own access): :func:`granted` takes out
what a ServiceAccount with no binding holds, leaving what the user's bindings give it.
"""
from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping

from ddpjob_sandbox.client import KubeClient

Grant = tuple[str, str, str]  # (verb, API group, resource with its "/subresource"), one RBAC rule entry
REVIEWS = "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews"


def rules_of(rules: Iterable[Mapping]) -> set[Grant]:
    """Every (verb, group, resource) the resource rules grant.

    Raises:
        AssertionError: a rule limited to resourceNames, which a grant without names would overstate.
    """
    grants = set()
    for rule in rules:
        assert not rule.get("resourceNames"), f"a rule limited to resourceNames, not expanded here: {rule}"
        grants |= {(verb, group, resource) for group in rule.get("apiGroups") or []
                   for resource in rule.get("resources") or [] for verb in rule["verbs"]}
    return grants


def review(kube: KubeClient, user: str, namespace: str) -> set[Grant]:
    """What ``user`` may do in ``namespace`` (which need not exist): its cluster-wide grants and
    those of the Roles bound to it there.

    Raises:
        AssertionError: the authorizer could not list every rule (``incomplete``), naming its error.
    """
    body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectRulesReview",
            "spec": {"namespace": namespace}}
    status = kube.request("POST", REVIEWS, body, headers={"Impersonate-User": user})["status"]
    assert not status.get("incomplete"), f"the rules of {user} in {namespace} are incomplete: {status}"
    return rules_of(status.get("resourceRules") or [])


def unbound_account(namespace: str) -> str:
    """A ServiceAccount user of ``namespace`` that nothing binds (it need not exist to be impersonated)."""
    return f"system:serviceaccount:{namespace}:unbound-{uuid.uuid4().hex[:6]}"


def granted(kube: KubeClient, account: str, namespace: str) -> set[Grant]:
    """What ServiceAccount user ``account`` (system:serviceaccount:NS:NAME) may do in ``namespace``
    beyond what an unbound ServiceAccount of its own namespace may: what its bindings give it."""
    own_namespace = account.split(":")[2]
    return review(kube, account, namespace) - review(kube, unbound_account(own_namespace), namespace)
