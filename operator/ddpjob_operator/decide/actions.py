"""What a pass decides: the actions one executor applies and the Events it posts.

The room's shared types. Every policy in decide/ returns these; none imports
another policy for them. Pure data: controller/kube.py (the cluster) and
local/ (`ddpjob run`) carry them out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

from ddpjob_operator.api import constants as C


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event to record on the DDPJob; its message is cut to C.MAX_EVENT_MESSAGE_CHARS
    (it may quote what a pod sent, a scheduler's message or every pending pod)."""

    type: str  # C.EVENT_NORMAL or C.EVENT_WARNING
    reason: str
    message: str

    def __post_init__(self) -> None:
        if len(self.message) > C.MAX_EVENT_MESSAGE_CHARS:  # cut as bounds.cut cuts (not imported: it reads the CRD)
            object.__setattr__(self, "message", self.message[:C.MAX_EVENT_MESSAGE_CHARS - 3] + "...")


@dataclass(frozen=True)
class CreateService:
    """Create the job's headless Service."""

    body: dict[str, Any]


@dataclass(frozen=True)
class CreatePod:
    """Create one node pod."""

    body: dict[str, Any]


@dataclass(frozen=True)
class CreateNetworkPolicy:
    """Create the job's NetworkPolicy (render/network_policy.py)."""

    body: dict[str, Any]


@dataclass(frozen=True)
class PatchNetworkPolicy:
    """Put the job's NetworkPolicy's spec back: from `observed` to `wanted` (the executor sends the difference)."""

    name: str
    observed: dict[str, Any]
    wanted: dict[str, Any]


@dataclass(frozen=True)
class CreateDisruptionBudget:
    """Create the job's PodDisruptionBudget (render/pdb.py)."""

    body: dict[str, Any]


@dataclass(frozen=True)
class PatchDisruptionBudget:
    """Merge-patch the job's PodDisruptionBudget (its spec after a scale)."""

    name: str
    patch: dict[str, Any]


@dataclass(frozen=True)
class DeleteDisruptionBudget:
    """Delete the job's PodDisruptionBudget (spec.runPolicy.podDisruptionBudget turned off)."""

    name: str


@dataclass(frozen=True)
class DeletePod:
    """Delete one pod; `reason` is for logs and Events."""

    name: str
    reason: str
    grace_period_seconds: int | None = None  # 0: force (the node will never confirm); None: the pod's own


@dataclass(frozen=True)
class DeleteJob:
    """Delete the DDPJob itself (TTL after finishing); ownership removes the rest."""

    reason: str


@dataclass(frozen=True)
class Requeue:
    """Run the reconciliation again after `after` seconds even without an event."""

    after: float


Action = Union[CreateService, CreatePod, CreateNetworkPolicy, PatchNetworkPolicy, CreateDisruptionBudget,
               PatchDisruptionBudget, DeleteDisruptionBudget, DeletePod, DeleteJob, Requeue]


def with_one_requeue(actions: list[Action], *afters: float | None) -> list[Action]:
    """`actions` with every Requeue (and each of `afters` that is not None) merged into one at
    the end, the earliest: a pass looks again at the first moment something changes unprompted."""
    requeues = [a.after for a in actions if isinstance(a, Requeue)] + [a for a in afters if a is not None]
    rest = [a for a in actions if not isinstance(a, Requeue)]
    return rest + ([Requeue(min(requeues))] if requeues else [])
