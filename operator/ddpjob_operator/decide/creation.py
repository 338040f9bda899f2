"""Creating a job's objects: bounded work per pass, and refusals a person can see (pure).

* The operator's own cap on replicas (``ddpjob-operator --max-replicas``), at most the CRD's
  fixed maximum (api.spec.MAX_REPLICAS): each pass lists every node pod of a job and the plan
  renders the missing ones, so a job's size is the operator's memory; a job above the cap is
  refused like an invalid spec (InvalidSpec names the field, its value and the setting) before
  anything is rendered.
* At most MAX_CREATES_PER_PASS node pods are created per pass; the rest come in the next
  passes (each created pod's event starts one, and a short requeue backs that up).
* A create the API refuses (403 quota, 422 invalid pod, ...) is learned only after the pass
  has written the status, so the controller keeps the last refusal per job and hands it to
  the next pass as an observed input (``CreateFailure``); ``create_failed_condition`` turns
  it into the PodCreateFailed condition with one Warning Event per distinct message, and
  back to False, with a Normal Event, once creates succeed again. Phases never depend on it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.spec import DDPJobSpec
from ddpjob_operator.api.validation import FieldError, checked_job
from ddpjob_operator.decide.actions import Event

# Creates per pass. Like the ReplicaSet controller's burstReplicas, a cap keeps one pass's
# memory and API burst bounded (a node pod renders to ~6 KiB of dicts); 100 creates are
# ~1 s of a default API server client budget, and a 1000-node job is created in 10 passes.
MAX_CREATES_PER_PASS = 100
BATCH_REQUEUE_SECONDS = 1.0  # the next batch's pass, should no pod event start it sooner
# A 429 or 5xx is usually the API server's passing trouble, not the job's: it is reported
# only once this many create rounds in a row failed (403, 422 and other 4xx at once).
PERSISTENT_ATTEMPTS = 3
MESSAGE_CHARS = 600  # of the API's message quoted in the condition and the Event
_REASON = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")  # metav1.Condition's reason rule


@dataclass(frozen=True)
class CreateFailure:
    """The last create of a job's pod or Service that the API refused, as the controller saw it."""

    kind: str  # "Pod" or "Service"
    name: str
    code: int | None  # HTTP status; None: no answer (connection lost, timeout)
    reason: str  # the API's machine-readable reason: Forbidden, Invalid, TooManyRequests, ...
    message: str  # the API's message, e.g. 'pods "mlp-node-3" is forbidden: exceeded quota: ...'
    attempts: int = 1  # create rounds in a row that failed


@dataclass(frozen=True)
class ConditionChange:
    """What the PodCreateFailed condition becomes, and the Events that say so."""

    status: str
    reason: str
    message: str
    events: list[Event] = field(default_factory=list)


def create_failed_condition(failure: CreateFailure | None,
                            old: Mapping[str, Any] | None) -> ConditionChange | None:
    """PodCreateFailed after a pass that saw ``failure`` (None: the last creates succeeded).

    Args:
        failure: the last refused create, from the previous pass.
        old: the PodCreateFailed condition in the previous status (None: absent).

    Returns:
        The change, or None to leave the condition as it is (nothing failed and it was not
        True, or a 429/5xx that has not persisted yet).
    """
    was_true = (old or {}).get("status") == "True"
    if failure is None:
        if not was_true:
            return None
        return ConditionChange("False", C.REASON_CREATES_SUCCEED, C.MSG_CREATES_SUCCEED,
                               [Event(C.EVENT_NORMAL, C.REASON_CREATES_SUCCEED, C.MSG_CREATES_SUCCEED)])
    if not reportable(failure):
        return None
    message = describe(failure)
    news = not was_true or (old or {}).get("message") != message
    events = [Event(C.EVENT_WARNING, C.REASON_POD_CREATE_FAILED, message)] if news else []
    return ConditionChange("True", condition_reason(failure), message, events)


def reportable(failure: CreateFailure) -> bool:
    """A refusal about the job (4xx) at once; the server's own trouble once it persists."""
    transient = failure.code is None or failure.code == 429 or failure.code >= 500
    return not transient or failure.attempts >= PERSISTENT_ATTEMPTS


def describe(failure: CreateFailure) -> str:
    """The condition's and the Event's message: what was refused, with the API's words."""
    answer = f"HTTP {failure.code} {failure.reason}".rstrip() if failure.code is not None else "no answer"
    text = " ".join(failure.message.split()) or "no message"
    if len(text) > MESSAGE_CHARS:
        text = text[:MESSAGE_CHARS - 3] + "..."
    return C.MSG_POD_CREATE_FAILED.format(kind=failure.kind, name=failure.name, answer=answer, message=text)


def condition_reason(failure: CreateFailure) -> str:
    """The API's reason (Forbidden, Invalid, ...) when it is a valid condition reason."""
    if _REASON.match(failure.reason or ""):
        return failure.reason
    return f"HTTP{failure.code}" if failure.code is not None else C.REASON_API_UNREACHABLE


def job_errors(body: Any, limit: int | None) -> list[FieldError]:
    """Every broken rule of a DDPJob for an operator capped at `limit` replicas (None: no cap):
    validate_job's, then the cap on each replica field those left unreported. What the operator
    reports as InvalidSpec and `ddpjob validate --max-replicas` prints."""
    return checked(body, limit)[0]


def checked(body: Any, limit: int | None) -> tuple[list[FieldError], DDPJobSpec | None]:
    """job_errors, and the typed spec when there are none (else None), parsed once for both."""
    errors, spec = checked_job(body)
    if not isinstance(body, Mapping) or not isinstance(body.get("spec"), Mapping):
        return errors, spec  # no replica fields to read (validate_job said why)
    reported = {e.path for e in errors}
    errors = errors + [e for e in replica_limit_errors(body.get("spec"), limit) if e.path not in reported]
    return errors, spec if not errors else None


def replica_limit_errors(body_spec: Mapping[str, Any] | None, limit: int | None) -> list[FieldError]:
    """The replica fields above the operator's --max-replicas (None: no cap), as FieldErrors.

    Checked on a spec that passed its own rules (a value above the CRD's maximum is reported by
    those, once). The fields are read as written: elasticPolicy.maxReplicas defaults to the larger
    of replicas and minReplicas, so the three fields cover the defaults.
    """
    if limit is None:
        return []
    spec = body_spec or {}
    elastic = spec.get("elasticPolicy") if isinstance(spec.get("elasticPolicy"), Mapping) else {}
    fields = {"spec.replicas": spec.get("replicas"),
              "spec.elasticPolicy.minReplicas": elastic.get("minReplicas"),
              "spec.elasticPolicy.maxReplicas": elastic.get("maxReplicas")}
    return [FieldError(path, value, C.RULE_MAX_REPLICAS.format(limit=limit)) for path, value in fields.items()
            if isinstance(value, int) and not isinstance(value, bool) and value > limit]
