"""Label and field selectors of list and watch requests, as predicates over objects."""
from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ddpjob_sandbox.emulator.common import api_error, get_path

_REQUIREMENT = re.compile(
    r"\s*(?P<neg>!)?\s*(?P<key>[A-Za-z0-9./_-]+)\s*"
    r"(?:(?P<op>==|=|!=)\s*(?P<value>[A-Za-z0-9._-]*)|\s+(?P<setop>in|notin)\s*\((?P<values>[^)]*)\))?\s*(?:,|$)")


def parse_label_selector(text: str):
    """A predicate over objects for a label selector string (equality- and set-based)."""
    requirements = []
    position = 0
    while position < len(text):
        match = _REQUIREMENT.match(text, position)
        if match is None or match.end() == position:
            raise api_error(400, "BadRequest", f"unable to parse label selector {text!r} at position {position}")
        requirements.append(_requirement(match))
        position = match.end()

    def matches(body: Mapping[str, Any]) -> bool:
        labels = body.get("metadata", {}).get("labels") or {}
        return all(requirement(labels) for requirement in requirements)

    return matches


def _requirement(match: re.Match):
    key, neg = match.group("key"), bool(match.group("neg"))
    if match.group("setop"):
        values = {v.strip() for v in match.group("values").split(",") if v.strip()}
        if match.group("setop") == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    if match.group("op") in ("=", "=="):
        return lambda labels: labels.get(key) == match.group("value")
    if match.group("op") == "!=":
        return lambda labels: labels.get(key) != match.group("value")
    return (lambda labels: key not in labels) if neg else (lambda labels: key in labels)


def parse_field_selector(text: str):
    """A predicate for a field selector. The API allows a few fields per resource (metadata.name
    and metadata.namespace everywhere, involvedObject.* on events, status.phase on pods...); the
    emulator accepts any dotted path, a superset that serves ``kubectl describe``'s event query."""
    requirements = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        match = re.fullmatch(r"(?P<path>[A-Za-z][A-Za-z0-9.]*)\s*(?P<op>==|=|!=)\s*(?P<value>.*)", part)
        if match is None:
            raise api_error(400, "BadRequest", f'unable to parse field selector requirement "{part}"')
        requirements.append(match.groupdict())

    def matches(body: Mapping[str, Any]) -> bool:
        for req in requirements:
            equal = str(get_path(body, req["path"]) or "") == req["value"]
            if equal != (req["op"] != "!="):
                return False
        return True

    return matches
