"""What the API answered that no watch shows, remembered from pass to pass (the operator's state
holds one; nothing here is module-global).

The cache holds only objects that carry the operator's labels and never a refusal of a write,
so the next pass knows these only from here: a NetworkPolicy create that met someone else's
policy of that name (409), a namespace that refused a policy create (403), and the grants
already reported missing (one log line per namespace and kind). The decisions over them are
pure (decide/isolation.py's observed_policy); this only keeps the facts.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable

logger = logging.getLogger("ddpjob_operator")

ObjectKey = tuple[str, str]  # (namespace, name)

NO_POLICY_GRANT = ("Cannot manage NetworkPolicies in %s (%s): its jobs run without one, so anything that "
                   "reaches their rendezvous store can run code in them; grant list, watch and "
                   "create on networking.k8s.io networkpolicies (the chart does)")
NO_BUDGET_GRANT = ("Cannot manage PodDisruptionBudgets in %s (%s): its jobs run without one, so a drain may "
                   "evict all of a job's pods at once; grant list, watch, create, patch and delete on "
                   "policy poddisruptionbudgets (the chart does)")


@dataclasses.dataclass
class ApiMemory:
    """The facts above; ``clock`` is monotonic seconds (a test passes its own)."""

    clock: Callable[[], float] = time.monotonic
    foreign_policies: dict[ObjectKey, float] = dataclasses.field(default_factory=dict)  # -> when the 409 came
    policy_create_refused: set[str] = dataclasses.field(default_factory=set)  # namespaces
    warned: set[tuple[str, str]] = dataclasses.field(default_factory=set)  # (kind, namespace) already logged

    def foreign_seconds_ago(self, key: ObjectKey) -> float | None:
        """Since a create met someone else's policy ``key`` (None: never, or it was created since)."""
        met = self.foreign_policies.get(key)
        return None if met is None else self.clock() - met

    def met_foreign_policy(self, key: ObjectKey) -> None:
        self.foreign_policies[key] = self.clock()

    def policy_created(self, key: ObjectKey) -> None:
        """A create of policy ``key`` went through (or found ours): the namespace grants it, the name is ours."""
        self.foreign_policies.pop(key, None)
        self.policy_create_refused.discard(key[0])

    def policy_create_forbidden(self, namespace: str) -> None:
        self.policy_create_refused.add(namespace)

    def forget(self, key: ObjectKey) -> None:
        """The job ``key`` is gone: so is what was remembered of its policy."""
        self.foreign_policies.pop(key, None)

    def warn_missing_grant(self, kind: str, namespace: str, message: str, *args: object) -> None:
        """Logs ``message`` once per kind and namespace: a missing grant is the admin's choice, not news each pass."""
        if (kind, namespace) not in self.warned:
            self.warned.add((kind, namespace))
            logger.warning(message, *args)
