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


@dataclass(frozen=True)
class DeleteRendezvousKeys:
    """Delete an etcd-v3 job's rendezvous keys (decide/rendezvous_keys.py says which jobs and when).

    The endpoints are the user's and one may never answer, so the executor runs this outside
    the pass and its concurrency slot (controller/etcd_cleanup.py); the Events it yields are
    posted like the pass's own.
    """

    endpoints: tuple[str, ...]  # spec.elasticPolicy.rdzvEndpoints
    job_uid: str  # metadata.uid: the executor deletes a job's keys once per process
    run_ids: tuple[str, ...]  # every --rdzv_id the job's groups used, one per rendezvous generation
    prefix: str  # where the keys are, for messages
    secret_name: str | None = None  # spec.elasticPolicy.rdzvSecretName
    namespace: str = "default"  # metadata.namespace: the agents' keys live under it (DDPJOB_NAMESPACE)
    allow_insecure_credentials: bool = False  # spec.elasticPolicy.rdzvAllowInsecureCredentials


Action = Union[CreateService, CreatePod, CreateNetworkPolicy, PatchNetworkPolicy, CreateDisruptionBudget,
               PatchDisruptionBudget, DeleteDisruptionBudget, DeletePod, DeleteJob, Requeue, DeleteRendezvousKeys]


def with_one_requeue(actions: list[Action], *afters: float | None) -> list[Action]:
    """`actions` with every Requeue (and each of `afters` that is not None) merged into one at
    the end, the earliest: a pass looks again at the first moment something changes unprompted."""
    requeues = [a.after for a in actions if isinstance(a, Requeue)] + [a for a in afters if a is not None]
    rest = [a for a in actions if not isinstance(a, Requeue)]
    return rest + ([Requeue(min(requeues))] if requeues else [])
