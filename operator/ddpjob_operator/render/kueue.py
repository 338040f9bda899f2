"""Kueue metadata on node pods: `spec.scheduling.queueName` admits them as one pod group (pure)."""

from __future__ import annotations

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.job_ref import JobRef
from ddpjob_operator.api.spec import DDPJobSpec


def kueue_metadata(ref: JobRef, spec: DDPJobSpec) -> tuple[dict[str, str], dict[str, str]]:
    """Labels and annotations that make Kueue admit the node pods as one workload.

    Kueue's plain pod-group integration groups pods by the pod-group-name label and waits
    for pod-group-total-count of them; a replacement pod keeps the group name, so Kueue
    counts it against the same admitted workload.

    The safe-to-forcefully-delete annotation lets Kueue's FailureRecoveryPolicy force-delete
    a node pod stuck terminating on an unreachable node: safe for DDPJob's pods, whose
    replacement joins a new rendezvous round and whose old workers, cut off from the group,
    cannot pass a collective (decide/stuck.py waits longer for such jobs, so Kueue acts first).

    Returns:
        ({} , {}) when spec.scheduling.queueName is unset.
    """
    queue = spec.scheduling.queue_name
    if not queue:
        return {}, {}
    labels = {C.LABEL_KUEUE_QUEUE: queue, C.LABEL_KUEUE_POD_GROUP: ref.name}
    return labels, {C.ANNOTATION_KUEUE_GROUP_COUNT: str(spec.node_pods),
                    C.ANNOTATION_KUEUE_SAFE_TO_FORCE_DELETE: "true"}


def companion_queue_labels(spec: DDPJobSpec) -> dict[str, str]:
    """The queue label of the job's companion pods (the c10d store, a managed etcd); {} without a queue.

    Without it Kueue never sees them (it manages only pods that name a queue), so they would run
    outside the job's quota. They are not in the nodes' pod group: each is a one-pod Workload of
    its own in the same LocalQueue, so it counts against the same ClusterQueue quota, and the
    node group's size (pod-group-total-count = replicas) stays what it says; the nodes are created
    once the store pod exists, gated or not, so neither waits for the other to be admitted.
    """
    queue = spec.scheduling.queue_name
    return {C.LABEL_KUEUE_QUEUE: queue} if queue else {}
