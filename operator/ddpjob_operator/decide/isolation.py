"""The job's NetworkPolicy: made before any pod, put back when edited, shown in a condition (pure).

Why before: the c10d store and a managed etcd have no authentication (docs/security.md), so
a pod that runs before its policy exists is reachable by anyone in the cluster for as long
as the gap lasts. While the policy is wanted and missing, its create is the pass's first
action, and the executor (controller/apply.py) makes it, and sees it succeed, before any
other write of the pass; a pass whose policy create fails creates no pod. While someone
else's policy holds its name, the pass creates no pod at all.

Why repaired: an edited policy (a wider podSelector, an extra ingress rule) isolates nothing,
and nobody would notice. Each pass (an edit of the policy starts one) compares the observed
spec with the rendered one and puts the whole spec back when they differ.

What is not held: a job whose operator may not read NetworkPolicies (403 on the list) or may
not create them (403 on the create) still runs, as before there was a policy, and the
condition says it runs without one: the grant is the cluster admin's choice, and the chart
gives it.

The NetworkPolicy condition (C.COND_NETWORK_POLICY) says which of these holds; a Warning
Event is posted when it turns False for a reason a person must act on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.names import network_policy_name
from ddpjob_operator.api.job_ref import JobRef
from ddpjob_operator.api.spec import DDPJobSpec
from ddpjob_operator.decide.actions import Action, CreateNetworkPolicy, CreatePod, Event, PatchNetworkPolicy, Requeue
from ddpjob_operator.decide.conditions import condition_of, set_condition
from ddpjob_operator.decide.observed import ObservedPolicy
from ddpjob_operator.render import objects as wanted
from ddpjob_operator.render.network_policy import OperatorPeer

# Look again this soon while someone else's policy holds the name: its deletion may start no pass
# (the cache starts one only for policies that carry the job's labels).
HOLD_POLL_SECONDS = 2.0


def plan_network_policy(ref: JobRef, spec: DDPJobSpec, observed: ObservedPolicy | None,
                        operator: OperatorPeer) -> list[Action]:
    """Create the policy when missing, put its spec back when it drifted; nothing for someone else's."""
    policy = wanted.one(wanted.wanted_objects(ref, spec, operator=operator, roles=(wanted.NETWORK_POLICY,)),
                        wanted.NETWORK_POLICY)
    if observed is None or policy is None or observed.state in (C.POLICY_FOREIGN, C.POLICY_UNREADABLE):
        return []
    body = policy.body()
    if observed.spec is None:
        return [CreateNetworkPolicy(body)]
    if dict(observed.spec) != body["spec"]:
        return [PatchNetworkPolicy(policy.name, dict(observed.spec), body["spec"])]
    return []


# How long the name is believed taken by someone else's policy after a create met it (a 409 read
# back), before the create is tried again. The cache holds only policies with the operator's labels,
# so an unlabelled foreign one is known from that answer alone (the executor remembers when it came):
# one create and one read a minute, not one a pass.
FOREIGN_POLICY_RECHECK_SECONDS = 60.0


def observed_policy(policy: Mapping[str, Any] | None, owner_uid: str, *, readable: bool = True,
                    create_refused: bool = False, foreign_seconds_ago: float | None = None) -> ObservedPolicy:
    """The job's NetworkPolicy as the pass sees it.

    Args:
        policy: the policy of the job's policy's name as the cache holds it (None: none there).
        owner_uid: the job's uid (a policy it does not control is someone else's).
        readable: the operator may list NetworkPolicies in the namespace (False: a 403).
        create_refused: the namespace's last create of a policy was refused (403).
        foreign_seconds_ago: since a create met someone else's policy of that name (None: never).
    """
    if not readable:
        return ObservedPolicy(C.POLICY_UNREADABLE)
    if policy is None and foreign_seconds_ago is not None and foreign_seconds_ago < FOREIGN_POLICY_RECHECK_SECONDS:
        return ObservedPolicy(C.POLICY_FOREIGN)
    return ObservedPolicy.of(policy, owner_uid, create_refused)


def holds_pods(observed: ObservedPolicy | None) -> bool:
    """Pods wait: someone else's policy has the job's policy's name (a missing one is created
    first in the same pass instead: see the module docstring)."""
    return observed is not None and observed.state == C.POLICY_FOREIGN


def behind_network_policy(actions: list[Action], observed: ObservedPolicy | None) -> list[Action]:
    """`actions` without pod creates while the policy holds them (and a look again soon)."""
    if not holds_pods(observed) or not any(isinstance(a, CreatePod) for a in actions):
        return actions
    return [a for a in actions if not isinstance(a, CreatePod)] + [Requeue(HOLD_POLL_SECONDS)]


@dataclass(frozen=True)
class PolicyCondition:
    """What the NetworkPolicy condition becomes."""

    status: str
    reason: str
    message: str


def policy_condition(ref: JobRef, spec: DDPJobSpec, observed: ObservedPolicy | None,
                     operator: OperatorPeer) -> PolicyCondition | None:
    """The condition for this observation; None to leave it as it is (not looked for: the job finished)."""
    name = network_policy_name(ref.name)
    if not spec.network_policy.enabled:
        return PolicyCondition("False", C.REASON_POLICY_DISABLED, C.MSG_POLICY_DISABLED.format(name=name))
    if observed is None:
        return None
    if observed.state == C.POLICY_PRESENT:
        if plan_network_policy(ref, spec, observed, operator):
            return PolicyCondition("False", C.REASON_POLICY_DRIFTED, C.MSG_POLICY_DRIFTED.format(name=name))
        return PolicyCondition("True", C.POLICY_PRESENT, C.MSG_POLICY_PRESENT.format(name=name))
    message = {C.POLICY_ABSENT: C.MSG_POLICY_ABSENT, C.POLICY_FOREIGN: C.MSG_POLICY_FOREIGN,
               C.POLICY_UNREADABLE: C.MSG_POLICY_UNREADABLE, C.POLICY_UNCREATABLE: C.MSG_POLICY_UNCREATABLE}
    return PolicyCondition("False", observed.state, message[observed.state].format(name=name, namespace=ref.namespace))


# A person acts on these; ABSENT is every job's first pass, and DISABLED the user's own choice.
_WARNED = (C.POLICY_FOREIGN, C.POLICY_UNREADABLE, C.POLICY_UNCREATABLE, C.REASON_POLICY_DRIFTED)


def report_policy(conditions: list[dict[str, Any]], previous: list[Mapping[str, Any]] | None,
                  change: PolicyCondition | None, now: str) -> tuple[list[dict[str, Any]], list[Event]]:
    """`conditions` with the NetworkPolicy condition set, and a Warning Event when its reason
    became one a person must act on (or the policy went missing after it existed)."""
    if change is None:
        return conditions, []
    old = condition_of(previous, C.COND_NETWORK_POLICY) or {}
    updated = set_condition(conditions, C.COND_NETWORK_POLICY, change.status, change.reason, change.message, now)
    news = old.get("reason") != change.reason
    lost = old.get("status") == "True" and change.reason == C.POLICY_ABSENT
    warn = news and (change.reason in _WARNED or lost)
    return updated, [Event(C.EVENT_WARNING, C.REASON_NETWORK_POLICY, change.message)] if warn else []
