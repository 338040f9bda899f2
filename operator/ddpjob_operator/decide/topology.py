"""Rendezvous topology: when losing one pod means restarting the whole group.

Pure. Where the rendezvous state lives decides what a lost pod costs:

  * c10d with the store on node 0 (`rdzvStore: node`): node 0's agent hosts the store. When
    node 0 fails or is deleted, every other agent loses the rendezvous within seconds, so
    all nodes restart together at once from the snapshot instead of each timing out alone;
  * c10d with a store pod (`rdzvStore: pod`): any training node is replaced alone (the
    others keep the rendezvous); losing the store pod loses the state: a whole-group restart;
  * etcd, etcd-v3: the state is in etcd, so a lost node is replaced alone.

A whole-group restart bumps `status.rendezvousGeneration`. The generation is part of the
rendezvous id (launch.rdzv_id) and a label of every node pod, so the new group never joins
a rendezvous of the old one, and pods of an older generation are deleted rather than mixed
with new ones. It counts as one failure incident (one Event), however many agents died of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterable, Mapping

from ddpjob_operator.api import constants as C

from ddpjob_operator.api.names import pod_name, rdzv_store_name
from ddpjob_operator.api.spec import DDPJobSpec
from ddpjob_operator.decide.budget import ledger_fields, ledger_of, open_incident
from ddpjob_operator.decide.failure import Outcome, classify_pod, describe_exit
from ddpjob_operator.decide.observed import Observed, PodView



def generation_of(status: Mapping[str, Any] | None) -> int:
    """status.rendezvousGeneration (0 before the first whole-group restart)."""
    return int((status or {}).get("rendezvousGeneration") or 0)


@dataclass(frozen=True)
class StoreLoss:
    """The rendezvous store was lost: what happened, and the failed pod if it failed."""

    what: str
    pod: PodView | None  # None when the pod was deleted rather than failed


def store_loss(job: str, spec: DDPJobSpec, observed: Observed, generation: int,
               handled: Iterable[str]) -> StoreLoss | None:
    """The loss of the rendezvous store, if one happened and was not handled.

    A missing store counts as lost only while a node of the current generation runs (it
    was deleted under a live group); at start-up or after a restart it is simply created.
    """
    handled = set(handled)
    groups = observed.of_generation(generation, spec.node_pods)
    if groups.training_over:
        return None  # training is over; nothing to restart
    if spec.elastic_policy.store_on_node:
        host = next((p for p in groups.current if p.index == 0), None)
        others = [p for p in groups.current if p.index != 0]
        if not others:
            return None  # a single node: replacing it is all a group restart would do
        return _loss(host, others, handled, f"node pod {pod_name(job, 0)} (the c10d store host)")
    if spec.elastic_policy.store_on_pod:
        return _loss(observed.store, list(groups.current), handled, f"rendezvous store pod {rdzv_store_name(job)}")
    return None


def _loss(host: PodView | None, nodes: list[PodView], handled: set[str], who: str) -> StoreLoss | None:
    if host is None:
        if any(p.phase == "Running" for p in nodes):
            return StoreLoss(f"{who} was deleted", None)
        return None
    if host.phase != "Failed" or host.uid in handled:
        return None
    return StoreLoss(describe_exit(who, host.exit_code, host.reason), host)


@dataclass(frozen=True)
class GroupRestart:
    """A whole-group restart: its message, and the status fields it changes."""

    message: str
    counted: bool  # it used one restart of failurePolicy.maxRestarts
    changes: dict[str, Any]  # rendezvousGeneration, handledFailures, and the ledger when counted


def begin_group_restart(job: str, spec: DDPJobSpec, observed: Observed, status: Mapping[str, Any],
                        now: datetime) -> GroupRestart | None:
    """A whole-group restart when the store was lost (None when none is due).

    Bumps rendezvousGeneration; counts one incident (unless the store was deleted or
    disrupted, which, like any disruption, does not use the budget, or the failure joins
    an incident already open); marks every failed pod of the old generation as handled
    so the agents that died with the store add no incidents and no Events of their own.
    A store host that failed with a permanent exit code is left to the normal failure
    path, which fails the job.
    """
    generation = generation_of(status)
    loss = store_loss(job, spec, observed, generation, status.get("handledFailures") or ())
    if loss is None:
        return None
    outcome = classify_pod(loss.pod, spec.failure_policy.permanent_exit_codes) if loss.pod else Outcome.DISRUPTION
    if outcome == Outcome.PERMANENT:
        return None
    opened = None
    if outcome == Outcome.RETRYABLE:
        failed_at = min(loss.pod.finished_at or now, now)
        opened = open_incident(ledger_of(status), failed_at, loss.pod.created_at)
    counted = opened is not None
    changes = {**(ledger_fields(opened, status) if counted else {}), "rendezvousGeneration": generation + 1,
               "handledFailures": sorted(set(status.get("handledFailures") or []) | {
                   p.uid for p in observed.pods if p.phase == "Failed" and p.generation <= generation})}
    # Whether this incident is charged is decided afterwards, from the failed pods' progress
    # records (budget.judge, in status.py); the message must not promise either way.
    budget = (f"one failure incident, charged to spec.failurePolicy.maxRestarts ({spec.failure_policy.max_restarts}) "
              "unless a newer snapshot was complete" if counted else "this does not use the restart budget")
    return GroupRestart(C.MSG_GROUP_RESTART.format(what=loss.what, generation=generation + 1, budget=budget),
                        counted, changes)

