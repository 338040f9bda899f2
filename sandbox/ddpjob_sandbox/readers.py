"""What a user reads of a DDPJob through the API: its node pods, status, conditions, Events."""
from __future__ import annotations

from ddpjob_operator.api import constants as C
from ddpjob_operator.render.common import selector

from ddpjob_sandbox.client import KubeClient


def pod_names(k8s: KubeClient, job: str = "mlp") -> list[str]:
    """The job's live node pods (the rendezvous store pod is not a node)."""
    return sorted(p["metadata"]["name"] for p in k8s.list("pods", label_selector=selector(job))
                  if not p["metadata"].get("deletionTimestamp"))


def status(k8s: KubeClient, job: str = "mlp") -> dict:
    """The job's status ({} before the operator wrote one)."""
    return k8s.get("ddpjobs", job).get("status") or {}


def condition(k8s: KubeClient, type_: str, job: str = "mlp") -> dict | None:
    """The job's condition of ``type_``, if any."""
    return next((c for c in status(k8s, job).get("conditions") or [] if c["type"] == type_), None)


def events(k8s: KubeClient, job: str = "mlp") -> list[tuple[str, str, str]]:
    """(type, reason, message) of every Event about the job, oldest first: about the DDPJob, not
    the objects named after it (a real cluster's controllers post Events on the job's Service)."""
    ours = [e for e in k8s.list("events")
            if (e["involvedObject"].get("kind"), e["involvedObject"]["name"]) == (C.KIND, job)]
    # A real API server lists Events by name (<object>.<random suffix>), not in the order they
    # came: sort by creation (whole seconds), then by resourceVersion (etcd's order of writes).
    ours.sort(key=lambda e: (e["metadata"].get("creationTimestamp", ""), int(e["metadata"].get("resourceVersion") or 0)))
    return [(e["type"], e["reason"], e["message"]) for e in ours]


def wait_for_event(k8s: KubeClient, reason: str, timeout: float, job: str = "mlp") -> tuple[str, str, str]:
    """The job's first Event of ``reason``, waiting for it: the operator posts a pass's Events
    after its status write, so a test that saw the status may be a moment ahead of them."""
    return k8s.wait_for(lambda: next((e for e in events(k8s, job) if e[1] == reason), None), timeout=timeout,
                        interval=0.2, what=f"a {reason} Event")
