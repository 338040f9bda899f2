"""The job's PodDisruptionBudget (pure): a drain shrinks the job to its minimum, one restart at a time below it.

Why: a drain (`kubectl drain`, a node upgrade, the cluster autoscaler) evicts through the
Eviction API, which honours budgets. Without one it may take every node of a job at once;
with one that allows nothing it blocks the drain forever. The budget ``<job>`` (owned by the
job, so garbage collection deletes it with the job) selects the node pods and the c10d store
pod and keeps ``minAvailable`` of them healthy:

  * node pods: ``min(minReplicas, replicas - 1)``. An elastic job (minReplicas < replicas)
    may be drained down to minReplicas, which torchrun re-forms without a restart budget
    charge (an eviction is a disruption). A job at its minimum (the default: minReplicas
    defaults to replicas) may still lose one pod at a time: the operator replaces it and the
    group restarts from the last snapshot (paced as below). Budget ``minAvailable: replicas`` would keep the job whole but block every drain
    forever, which a cluster admin then overrides by deleting pods, with no pacing at all;
  * the store pod (rdzvStore: pod) counts as one more: losing it restarts the group like
    losing a node, so it is paced in the same budget rather than in one of its own (a budget
    over one pod either blocks forever or protects nothing).

Both are capped at one below the pods Ready now (``healthy``, counted each pass): a job
that runs below its size (the rest Pending on a full cluster, or evicted a moment ago) still
lets a drain evict one pod. Never allowing none costs pacing: after an eviction the next
pass lowers the budget before the replacement is Ready, so a drain may take a job at its
minimum down one pod per pass rather than one per replacement; each eviction is a restart
from the last snapshot, but no drain ever waits on this job.

``unhealthyPodEvictionPolicy: AlwaysAllow`` lets a drain take pods that are not Ready (still
starting, or waiting in a rendezvous) whatever the budget: they hold no training to protect,
and a job that cannot become Ready must not hold a node hostage. The managed etcd pod is not
covered: it is one pod, and its loss is repaired like the store's.
"""

from __future__ import annotations

from typing import Any

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.names import disruption_budget_name
from ddpjob_operator.api.job_ref import JobRef
from ddpjob_operator.api.spec import DDPJobSpec
from ddpjob_operator.render.common import common_labels, companion_metadata

BUDGETED_COMPONENTS = (C.COMPONENT_NODE, C.COMPONENT_RDZV_STORE)  # the pods the budget selects


def min_available(spec: DDPJobSpec, healthy: int | None = None) -> int:
    """Pods of the job a voluntary eviction must leave healthy (see the module docstring).

    Args:
        spec: the job's spec.
        healthy: the job's pods the budget selects that are Ready now (None: all of them, as
            ``ddpjob render`` shows the job running whole). The budget keeps one below it, so
            whatever the job runs at it allows an eviction: a job stuck at its minimum (the rest
            of its pods Pending on a full cluster) would otherwise hold every drain forever.
    """
    nodes = min(spec.min_replicas, spec.desired_replicas - 1)
    wanted = nodes + (1 if spec.elastic_policy.store_on_pod else 0)
    if healthy is None:
        return wanted
    return max(min(wanted, healthy - 1), 0)


def budget_spec(ref: JobRef, spec: DDPJobSpec, healthy: int | None = None) -> dict[str, Any]:
    """The budget's spec: what plan.py compares with the observed one and patches on scale,
    and when the number of ``healthy`` pods changes (see min_available)."""
    return {
        "minAvailable": min_available(spec, healthy),
        "selector": {
            "matchLabels": {C.LABEL_JOB_NAME: ref.name},
            "matchExpressions": [{"key": C.LABEL_COMPONENT, "operator": "In",
                                  "values": list(BUDGETED_COMPONENTS)}],
        },
        "unhealthyPodEvictionPolicy": "AlwaysAllow",
    }


def render_disruption_budget(ref: JobRef, spec: DDPJobSpec, healthy: int | None = None) -> dict[str, Any]:
    """PodDisruptionBudget <job> over the job's node pods and store pod, owned by the job."""
    return {
        "apiVersion": C.POLICY_API_VERSION,
        "kind": "PodDisruptionBudget",
        "metadata": companion_metadata(ref, disruption_budget_name(ref.name), common_labels(ref.name)),
        "spec": budget_spec(ref, spec, healthy),
    }
