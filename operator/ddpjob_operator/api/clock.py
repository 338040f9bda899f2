"""RFC 3339 timestamps as Kubernetes writes them; pure code takes `now` as an argument."""

from __future__ import annotations

from datetime import datetime, timezone


def format_time(moment: datetime) -> str:
    """'2026-01-02T03:04:05Z' (UTC, whole seconds, like the API server)."""
    return moment.astimezone(timezone.utc).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str | None) -> datetime | None:
    """The datetime of an RFC 3339 string, None for None or ''."""
    if not text:
        return None
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def seconds_between(start: datetime, end: datetime) -> float:
    """end - start in seconds."""
    return (end - start).total_seconds()
