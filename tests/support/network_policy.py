"""Evaluates a NetworkPolicy's ingress rules as a network plugin would, for tests of what it admits.

Covers what ddpjob's policies use: matchLabels and matchExpressions (In, NotIn, Exists,
DoesNotExist), peers with a podSelector, a namespaceSelector or both, and numeric ports.
Semantics from the networking.k8s.io/v1 API reference: a rule without ``from`` admits every
source, one without ``ports`` every port; a peer with only a podSelector means pods of the
policy's own namespace; namespaces are matched by their ``kubernetes.io/metadata.name`` label.

Why an imitation, with a real control plane in the tests: the API server only validates and
stores a NetworkPolicy; a network plugin (Calico, Cilium) enforces it, and the sandbox's kubelets
run pods as local processes on one loopback, with no pod network for a plugin to filter. So who
gets in is stated here; that the policies are valid is the API server's to say
(tests/cluster/test_network_policy_on_apiserver.py).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A LabelSelector against labels; the empty selector matches everything."""
    if not dict(selector.get("matchLabels") or {}).items() <= dict(labels).items():
        return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression["key"], expression["operator"], expression.get("values") or []
        found = {"Exists": key in labels, "DoesNotExist": key not in labels,
                 "In": key in labels and labels[key] in values, "NotIn": labels.get(key) not in values}[operator]
        if not found:
            return False
    return True


def selects(policy: Mapping[str, Any], pod_labels: Mapping[str, str], namespace: str) -> bool:
    """Whether the policy applies to a pod (it isolates the pod for ingress)."""
    return namespace == policy["metadata"]["namespace"] and matches(policy["spec"]["podSelector"], pod_labels)


def _peer_matches(peer: Mapping[str, Any], policy_namespace: str, labels: Mapping[str, str], namespace: str) -> bool:
    if "namespaceSelector" in peer:
        in_namespace = matches(peer["namespaceSelector"], {"kubernetes.io/metadata.name": namespace})
    else:
        in_namespace = namespace == policy_namespace
    return in_namespace and matches(peer.get("podSelector") or {}, labels)


def admitted(policy: Mapping[str, Any], pod_labels: Mapping[str, str], namespace: str, port: int) -> bool:
    """Whether a pod with ``pod_labels`` in ``namespace`` may connect to ``port`` of a pod the policy selects."""
    for rule in policy["spec"].get("ingress") or []:
        if rule.get("ports") and port not in [p["port"] for p in rule["ports"]]:
            continue
        peers = rule.get("from")
        if not peers or any(_peer_matches(p, policy["metadata"]["namespace"], pod_labels, namespace) for p in peers):
            return True
    return False
