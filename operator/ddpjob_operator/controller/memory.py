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


@dataclasses.dataclass
class _Kept:
    uid: str
    stored: dict  # the stored status the kept one was computed over
    kept: dict | None  # the status computed but not written yet (None: nothing pending)
    written_at: float  # when the status was last written, or the job first seen


@dataclasses.dataclass
class StatusMemory:
    """The statuses computed but not yet written (decide/writes.py), per job; ``clock`` is
    monotonic seconds (a test passes its own).

    A pass takes the kept status as its previous one while the stored status is still the one
    it was computed over, so the hang clock (progress.step and advancedTime) and the straggler
    spell run on every poll, written or not. An operator restart loses what was kept: the next
    passes start from the stored status, at most one write interval old. A step that moved
    since then restarts the hang clock at the restart, so a hang that began within one interval
    before it is noticed at most one interval late (an older one is in the stored status, and
    noticed on time); a straggler's slow spell restarts with it; the step column and
    lastSnapshot go back by at most one interval until the job's next write.
    """

    clock: Callable[[], float] = time.monotonic
    jobs: dict[ObjectKey, _Kept] = dataclasses.field(default_factory=dict)

    def previous(self, key: ObjectKey, uid: str, stored: dict) -> dict:
        """The status a pass over job ``key`` (``uid``, whose stored status is ``stored``) computes
        from: the kept one, unless someone wrote the status since (then the stored one wins)."""
        entry = self.jobs.get(key)
        if entry is None or entry.uid != uid:
            self.jobs[key] = _Kept(uid, stored, None, self.clock())
            return stored
        if entry.kept is None or entry.stored != stored:
            entry.stored, entry.kept = stored, None
            return stored
        return entry.kept

    def since_write(self, key: ObjectKey) -> float:
        entry = self.jobs.get(key)
        return 0.0 if entry is None else self.clock() - entry.written_at

    def wrote(self, key: ObjectKey, uid: str) -> None:
        """The pass wrote its status: nothing is kept, and the interval starts again."""
        self.jobs[key] = _Kept(uid, {}, None, self.clock())

    def keep(self, key: ObjectKey, computed: dict) -> None:
        """``computed`` was not written: the next pass starts from it."""
        entry = self.jobs.get(key)
        if entry is not None:
            entry.kept = computed

    def forget(self, key: ObjectKey) -> None:
        self.jobs.pop(key, None)
