"""What a pass must observe, decided from the job as it stands before the pass (pure).

The controller reads exactly what this says and nothing more: the progress endpoints of a
job that trains (when polling is on), the job's NetworkPolicy and PodDisruptionBudget while
they are wanted, its managed etcd when it asks for one, and the Nodes of pods stuck
terminating (stuck.py). The body is read before validation: an invalid job is still
observed, so its status can say what is wrong with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterable, Mapping

from ddpjob_operator.decide import phases, stuck
from ddpjob_operator.decide.observed import PodView
from ddpjob_operator.render import network_policy


@dataclass(frozen=True)
class Observation:
    """What to read this pass, beside the pods and Services that every pass reads."""

    progress: bool = False  # read one running node's progress endpoint (controller/live_progress.py)
    network_policy: bool = False  # read the job's NetworkPolicy (decide/isolation.py)
    disruption_budget: bool = False  # read the job's PodDisruptionBudget (render/pdb.py)
    managed_etcd: bool = False  # read the job's own etcd pod and Service (decide/managed_etcd.py)

    @staticmethod
    def nodes(pods: Iterable[PodView], now: datetime) -> list[str]:
        """The Nodes to read once the pods are known: those of pods stuck terminating (stuck.py)."""
        return stuck.nodes_to_read(pods, now)


def managed_etcd_requested(body: Mapping[str, Any]) -> bool:
    """The body asks for a managed etcd (decide/managed_etcd.py)."""
    ep = (body.get("spec") or {}).get("elasticPolicy") or {}
    return bool((ep.get("managedEtcd") or {}).get("enabled"))


def what_to_observe(body: Mapping[str, Any], progress_poll: float) -> Observation:
    """What a pass over ``body`` reads.

    Args:
        body: the DDPJob as the pass found it (its status is the previous pass's).
        progress_poll: --progress-poll-seconds (0: progress endpoints are never read).
    """
    status = body.get("status")
    running = not phases.finished(status)  # a finished job's policy and budget are left as they are
    return Observation(progress=phases.progress_poll_requeue(status, progress_poll) is not None,
                       network_policy=running and network_policy.requested(body),
                       disruption_budget=running,
                       managed_etcd=managed_etcd_requested(body))
