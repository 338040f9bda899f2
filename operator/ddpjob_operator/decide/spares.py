"""Warm spares (spec.elasticPolicy.spareReplicas): how the operator counts them. Pure.

A spare is one more node pod, rendered like every other (render/objects.py: indexes replicas ..
replicas + spareReplicas - 1), running the same torchrun command with the same --nnodes MIN:MAX.
Its agent finds the round complete at max_nodes and parks in the rendezvous' redundancy list: it
heartbeats, it is not counted as waiting (so the group does not restart for it), and when a
participant leaves it joins the next round at once. So which pod is a spare is decided by the
rendezvous, not by its index: after a loss the pod of a lower index that replaces the lost one
is the new spare. The API rule (api/spec.py, SPARE_RULE) allows spares only where replicas equals
maxReplicas, so every Ready node pod beyond maxReplicas is one that waits outside the round.

The operator does not read the rendezvous store; it counts from the pods it observes (the
current generation's node pods that are Ready), which is what these functions take.
"""

from __future__ import annotations

from ddpjob_operator.api.spec import DDPJobSpec


def in_round(spec: DDPJobSpec, ready: int) -> int:
    """Of `ready` Ready node pods, how many the round can hold (status.rendezvousReplicas): at most
    maxReplicas; the rest are spares."""
    return min(ready, spec.max_replicas)


def waiting(spec: DDPJobSpec, ready: int) -> int | None:
    """status.spares: Ready node pods beyond the round (maxReplicas), at most spareReplicas; None
    for a job that asks for no spares (the field stays out of its status).

    Right after a loss it reads 0 until the replacement pod is Ready: the old spare has joined the
    round, and the new one is still starting."""
    if not spec.spare_replicas:
        return None
    return min(spec.spare_replicas, max(0, ready - spec.max_replicas))
