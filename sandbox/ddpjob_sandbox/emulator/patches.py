"""PATCH bodies as the API server applies them: JSON merge patch (RFC 7386), JSON patch (RFC 6902)."""
from __future__ import annotations

import copy
from typing import Any

from ddpjob_sandbox.emulator.common import api_error

MERGE_PATCH_TYPES = ("application/merge-patch+json", "application/strategic-merge-patch+json")
JSON_PATCH_TYPE = "application/json-patch+json"


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: dicts merge recursively, ``null`` removes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def json_patch(target: Any, operations: list[dict]) -> Any:
    """RFC 6902 JSON patch (add, remove, replace, test, move, copy); a failed ``test`` is a 422."""
    doc = copy.deepcopy(target)
    for op in operations:
        path = _pointer(op["path"])
        if op["op"] == "test":
            if _pointer_get(doc, path) != op.get("value"):
                raise api_error(422, "Invalid", f"the server rejected our request: test failed at {op['path']}: "
                                f"{_pointer_get(doc, path)!r} != {op.get('value')!r}")
        elif op["op"] in ("add", "replace"):
            doc = _pointer_set(doc, path, copy.deepcopy(op["value"]), insert=op["op"] == "add")
        elif op["op"] == "remove":
            doc = _pointer_remove(doc, path)
        elif op["op"] in ("move", "copy"):
            source = _pointer(op["from"])
            value = copy.deepcopy(_pointer_get(doc, source))
            if op["op"] == "move":
                doc = _pointer_remove(doc, source)
            doc = _pointer_set(doc, path, value, insert=True)
        else:
            raise api_error(422, "Invalid", f"unsupported JSON-patch op {op['op']!r}")
    return doc


def _pointer(path: str) -> list[str]:
    return [part.replace("~1", "/").replace("~0", "~") for part in path.split("/")[1:]] if path else []


def _pointer_get(doc: Any, path: list[str]) -> Any:
    for part in path:
        try:
            doc = doc[int(part)] if isinstance(doc, list) else doc[part]
        except (KeyError, IndexError, ValueError, TypeError):
            return None
    return doc


def _pointer_parent(doc: Any, path: list[str]) -> Any:
    parent = _pointer_get(doc, path[:-1])
    if not isinstance(parent, (dict, list)):
        raise api_error(422, "Invalid", f"JSON-patch path /{'/'.join(path)} has no parent")
    return parent


def _pointer_set(doc: Any, path: list[str], value: Any, insert: bool) -> Any:
    if not path:
        return value
    parent, last = _pointer_parent(doc, path), path[-1]
    if isinstance(parent, list):
        index = len(parent) if last == "-" else int(last)
        parent.insert(index, value) if insert else parent.__setitem__(index, value)
    else:
        parent[last] = value
    return doc


def _pointer_remove(doc: Any, path: list[str]) -> Any:
    parent, last = _pointer_parent(doc, path), path[-1]
    try:
        del parent[int(last) if isinstance(parent, list) else last]
    except (KeyError, IndexError, ValueError):
        raise api_error(422, "Invalid", f"JSON-patch cannot remove /{'/'.join(path)}: it does not exist") from None
    return doc


def apply_patch(target: dict, patch: Any, content_type: str) -> dict:
    """Applies a PATCH body by its content type (strategic merge is treated as a merge patch)."""
    kind = content_type.split(";")[0].strip().lower()
    if kind == JSON_PATCH_TYPE:
        if not isinstance(patch, list):
            raise api_error(400, "BadRequest", "a JSON patch must be a list of operations")
        return json_patch(target, patch)
    if kind in MERGE_PATCH_TYPES:
        if not isinstance(patch, dict):
            raise api_error(400, "BadRequest", "a merge patch must be a JSON object")
        return merge_patch(target, patch)
    raise api_error(415, "UnsupportedMediaType", f"the emulator does not support patch type {content_type!r}")
