"""Which cluster tests need the sandbox's own control plane, and why: against a cluster of one's own
(``pytest tests/cluster --kubeconfig PATH``) they are deselected, and the run's summary counts them
by reason. Never a silent skip: pytest's own line says how many were deselected, this module's says why.

A test is sandbox-only when it requests a fixture of :data:`FIXTURES` (directly or through
another fixture: the helm-installed operator's fixtures run on ``kubelets``), or carries
``@pytest.mark.sandbox_only(REASON)`` (one of the reasons below) because it reads what only the
sandbox has (``control_plane.layout``: its PKI, audit log, etcd, binaries) or starts a control plane
of its own. A test that reaches for ``layout`` without the marker fails against an external cluster
with SandboxOnlyError naming this module, so a forgotten marker shows.
"""
from __future__ import annotations

import collections

import pytest

# Each reason says what the sandbox has that a cluster reached by a kubeconfig does not give.
KUBELETS = ("runs pods on the sandbox's kubelets (local processes whose Node identities the sandbox's PKI "
            "mints), the helm-installed operator's pod among them")
NODE_IDENTITIES = "registers Nodes logged in as their own kubelets, with certificates the sandbox's PKI mints"
AUDIT_LOG = "reads the sandbox API server's audit log"
ADMIN_CERTIFICATE = "checks the sandbox admin's own client certificate or the pinned binaries beside it"
OWN_CONTROL_PLANE = "starts a control plane of its own"
REASONS = (KUBELETS, NODE_IDENTITIES, AUDIT_LOG, ADMIN_CERTIFICATE, OWN_CONTROL_PLANE)

# Fixtures that only the sandbox's control plane can give, and why.
FIXTURES = {
    "kubelets": KUBELETS,
    "controller_requests": AUDIT_LOG,
}


def reason(item: pytest.Item) -> str | None:
    """Why ``item`` can run only on the sandbox's own control plane, or None where it runs anywhere.

    Raises:
        pytest.UsageError: a ``sandbox_only`` marker without one of :data:`REASONS`.
    """
    marker = item.get_closest_marker("sandbox_only")
    if marker is not None:
        if len(marker.args) != 1 or marker.args[0] not in REASONS:
            raise pytest.UsageError(f"{item.nodeid}: sandbox_only{marker.args!r} must name one reason of "
                                    f"tests/cluster/sandbox_only.py REASONS")
        return marker.args[0]
    return next((FIXTURES[name] for name in item.fixturenames if name in FIXTURES), None)


def split(items: list[pytest.Item]) -> tuple[list[pytest.Item], dict[str, list[str]]]:
    """The items that run anywhere, and the node ids of the others by reason."""
    kept, deselected = [], collections.defaultdict(list)
    for item in items:
        why = reason(item)
        if why is None:
            kept.append(item)
        else:
            deselected[why].append(item.nodeid)
    return kept, dict(deselected)


def summary(kubeconfig: str, deselected: dict[str, list[str]], verbose: bool) -> list[str]:
    """The summary lines: how many were deselected against the cluster of ``kubeconfig``, per reason
    (each node id too when verbose)."""
    total = sum(map(len, deselected.values()))
    lines = [f"against the cluster of {kubeconfig}: {total} sandbox-only tests deselected"]
    for why, ids in sorted(deselected.items(), key=lambda kv: -len(kv[1])):
        lines.append(f"  {len(ids)} {why}")
        lines += [f"    {nodeid}" for nodeid in ids] if verbose else []
    return lines
