"""The CRD bounds every list and string of .status, so the API server refuses a status a pod could
grow without end; and the operator's own caps are within those bounds, so its write is never
the one refused (decide/bounds.py cuts to the same schema)."""

from __future__ import annotations

import pytest
from ddpjob_rdzv.contract import progress_record

from ddpjob_operator.api import constants as C
from ddpjob_operator.api import crd
from ddpjob_operator.api.status import STATUS_FIELDS
from ddpjob_operator.decide import failure, last_valid

STATUS = crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
# etcd refuses an object over 1.5 MiB; the status must leave most of that to the spec and metadata.
WORST_STATUS_BYTES = 512 * 1024


def walk(node, path="status"):
    yield path, node
    for name, child in (node.get("properties") or {}).items():
        yield from walk(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from walk(node["items"], f"{path}[]")


def at(path: str) -> dict:
    return dict(walk(STATUS))[path]


def test_the_status_field_list_is_the_schemas_status_properties_in_order():
    """STATUS_FIELDS is read off the model, so the keys decide/ writes are the keys the API server keeps."""
    assert STATUS_FIELDS == tuple(STATUS["properties"]) and "workerRestartsByPod" in STATUS_FIELDS


def test_every_string_and_list_of_the_status_has_a_bound():
    unbounded = [path for path, node in walk(STATUS)
                 if (node.get("type") == "string" and "enum" not in node and "maxLength" not in node)
                 or (node.get("type") == "array" and "maxItems" not in node)]
    assert unbounded == []


@pytest.mark.parametrize(("path", "key", "cap"), [
    ("status.failures", "maxItems", C.MAX_FAILURES_KEPT),
    ("status.avoidedNodes", "maxItems", C.MAX_AVOIDED_NODES),
    ("status.invalidProgressRecords", "maxItems", C.MAX_RECORD_PROBLEMS_KEPT),
    ("status.failures[].message", "maxLength", failure.MESSAGE_CHARS),  # a log tail's end
    ("status.failures[].message", "maxLength", progress_record.MAX_ERROR_CHARS),  # the trainer's error or fatal
    ("status.failures[].reason", "maxLength", 64),  # a fatal reason, as the record contract allows it
    ("status.failures[].stalledNodes[]", "maxLength", progress_record.MAX_NODE_CHARS),
    ("status.progress.slowestNode", "maxLength", progress_record.MAX_NODE_CHARS),
    ("status.progress.reportedStraggler", "maxLength", progress_record.MAX_NODE_CHARS),
    ("status.progress.run", "maxLength", progress_record.MAX_TIME_CHARS),
    ("status.lastSnapshot.path", "maxLength", progress_record.MAX_PATH_CHARS),
    ("status.invalidProgressRecords[].field", "maxLength", progress_record.MAX_FIELD_CHARS),
    ("status.invalidProgressRecords[].field", "maxLength", len("nodes[127].") + progress_record.KEY_CHARS),
])
def test_the_operators_own_caps_are_within_the_crds(path, key, cap):
    assert cap <= at(path)[key], f"{path}: the code keeps {cap}, the CRD allows {at(path)[key]}"


def worst_bytes(node) -> int:
    """The longest JSON a status within the schema's bounds can be (characters; ASCII)."""
    kind = node.get("type")
    if "enum" in node:
        return max(len(str(v)) for v in node["enum"]) + 2
    if kind == "string":
        return node["maxLength"] + 2
    if kind == "array":
        return node["maxItems"] * (worst_bytes(node["items"]) + 1) + 2
    if kind == "object" and "properties" in node:
        return sum(len(k) + 4 + worst_bytes(v) for k, v in node["properties"].items()) + 2
    return 24  # a number, a boolean, or lastValid.spec (counted below)


def test_the_largest_status_the_crd_admits_leaves_room_under_etcds_limit():
    worst = worst_bytes(STATUS) + last_valid.MAX_SPEC_BYTES
    assert worst < WORST_STATUS_BYTES, worst
