"""Kubernetes-style conditions: set one, and lastTransitionTime moves only when its status flips (pure).

A shared module of the decide/ room: status.py and the policies that own a condition
(last_valid.py, creation.py through status.py) use the same rule without importing one another.
"""

from __future__ import annotations

from typing import Any, Mapping


def set_condition(conditions: list[dict[str, Any]], type_: str, status: str, reason: str,
                  message: str, now: str) -> list[dict[str, Any]]:
    """Conditions with `type_` set; lastTransitionTime moves only when the status flips."""
    result, found = [], False
    for cond in conditions:
        if cond.get("type") != type_:
            result.append(cond)
            continue
        found = True
        moved = cond.get("status") != status
        result.append({"type": type_, "status": status, "reason": reason, "message": message,
                       "lastTransitionTime": now if moved else cond.get("lastTransitionTime", now)})
    if not found:
        result.append({"type": type_, "status": status, "reason": reason, "message": message,
                       "lastTransitionTime": now})
    return result


def condition_of(conditions: list[Mapping[str, Any]] | None, type_: str) -> Mapping[str, Any] | None:
    """The condition of `type_` (None when absent)."""
    return next((c for c in conditions or [] if c.get("type") == type_), None)
