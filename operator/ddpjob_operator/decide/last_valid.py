"""The last valid spec: an invalid edit does not orphan a running job (pure).

Every pass with a valid spec records it in ``status.lastValid`` ({generation, spec}), in the
pass's one status write. When an edit breaks a rule the CRD schema could not check (or the
operator's --max-replicas), the pass goes on with that recorded spec: failed pods are replaced
from it and runPolicy.activeDeadlineSeconds and ttlSecondsAfterFinished are enforced as before
the edit, while condition InvalidSpec (and one Warning Event per message) says what is wrong
and which generation still runs. A job that was never valid has nothing to fall back on: it is
Failed with InvalidSpec and gets no pods, as before.

Why the status, not an annotation: only the operator writes the status subresource, so
whoever may edit a DDPJob cannot plant a spec that never passed the CRD's rules (an image
change the immutability rule forbids, say), and the pure pass reads it from the body it was
given. Bounded: a spec over MAX_SPEC_BYTES of JSON is not kept (that job has no fallback);
the status patch carries it only when it changed (controller/apply.py's merge_patch).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Mapping

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.clock import format_time
from ddpjob_operator.api.spec import DDPJobSpec
from ddpjob_operator.api.validation import FieldError, validate_spec
from ddpjob_operator.decide.actions import Event
from ddpjob_operator.decide.bounds import cut
from ddpjob_operator.decide.conditions import condition_of, set_condition
from ddpjob_operator.decide.creation import replica_limit_errors

# 64 KiB: typical specs are 1-4 KiB, and a DDPJob may grow by this much at most, against
# etcd's 1.5 MiB object limit.
MAX_SPEC_BYTES = 64 * 1024


def kept_spec(body: Mapping[str, Any], max_replicas: int | None = None) -> DDPJobSpec | None:
    """The spec to run while the body's own is invalid: the recorded one, checked again (the
    rules or --max-replicas may have changed since); None when there is none."""
    recorded = ((body.get("status") or {}).get("lastValid") or {}).get("spec")
    if not isinstance(recorded, Mapping) or replica_limit_errors(recorded, max_replicas) or validate_spec(recorded):
        return None
    return DDPJobSpec.model_validate(recorded)


def record(status: Mapping[str, Any], body: Mapping[str, Any], errors: list[FieldError], kept: bool,
           now: datetime) -> tuple[dict[str, Any], list[Event]]:
    """``status`` with lastValid, and InvalidSpec while a recorded spec stands in; plus its Event.

    Args:
        status: the status computed with the spec this pass ran with.
        body: the DDPJob as read (its spec, generation and previous status).
        errors: what is wrong with the body's spec (empty: valid).
        kept: the pass ran with the recorded spec because the body's is invalid.
        now: the current time.
    """
    prev = body.get("status") or {}
    status = dict(status)
    status["lastValid"] = _entry(body) if not errors else prev.get("lastValid")
    status = {k: v for k, v in status.items() if v is not None}
    finished = prev.get("phase") in C.FINISHED_PHASES and prev.get("completionTime")
    if not kept or finished:
        return status, []
    message = cut(C.MSG_INVALID_KEPT.format(errors="; ".join(e.message for e in errors),  # as the condition keeps it
                                            generation=prev["lastValid"].get("generation")),
                  C.MAX_CONDITION_MESSAGE_CHARS)
    old = condition_of(prev.get("conditions"), C.COND_INVALID_SPEC)
    # The pass ran as if valid, which turned a True InvalidSpec False: put the old one back first,
    # so that lastTransitionTime stays where the condition last flipped.
    conditions = [dict(old) if old and c.get("type") == C.COND_INVALID_SPEC else c
                  for c in status.get("conditions") or []]
    status["conditions"] = set_condition(conditions, C.COND_INVALID_SPEC, "True", C.REASON_INVALID_SPEC,
                                         message, format_time(now))
    news = (old or {}).get("status") != "True" or old.get("message") != message
    return status, [Event(C.EVENT_WARNING, C.REASON_INVALID_SPEC, message)] if news else []


def _entry(body: Mapping[str, Any]) -> dict[str, Any] | None:
    spec = body.get("spec") or {}
    if len(json.dumps(spec, separators=(",", ":"))) > MAX_SPEC_BYTES:
        return None
    return {"generation": int((body.get("metadata") or {}).get("generation") or 0), "spec": spec}
