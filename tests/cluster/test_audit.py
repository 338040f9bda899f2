"""Requests counted per client from the API server's audit log (control_plane.audit): a window
between two marks, a watch counted once, hostile field names refused; and on the real API
server, each verb of one client counted as it was sent."""
from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from ddpjob_sandbox.client import KubeClient
from ddpjob_sandbox.control_plane import ControlPlane, audit
from tests.cluster.sandbox_only import AUDIT_LOG

ADMIN = "ddpjob-admin"  # the admin client certificate's user (control_plane.pki)


def event(audit_id: str, verb: str = "get", resource: str = "pods", user: str = "alice", stage: str = "ResponseComplete",
          code: int = 200, **ref: str) -> bytes:
    return json.dumps({"kind": "Event", "auditID": audit_id, "stage": stage, "verb": verb, "requestURI": f"/{audit_id}",
                       "userAgent": "kopf/1.0",
                       "user": {"username": user}, "objectRef": {"resource": resource, **ref},
                       "responseStatus": {"code": code}}).encode() + b"\n"


def test_a_window_between_two_marks_holds_only_the_requests_logged_in_it(tmp_path: Path):
    log = tmp_path / "audit.log"
    assert audit.mark(log) == 0, "no log yet: the window starts at its beginning"
    log.write_bytes(event("a", "list"))
    start = audit.mark(log)
    with open(log, "ab") as out:
        out.write(event("b", "create", namespace="ns", name="p0", code=201) + event("c", "delete", code=200))
    end = audit.mark(log)
    with open(log, "ab") as out:
        out.write(event("d", "get"))
    found = audit.requests(log, start, end)
    assert [(r.audit_id, r.verb, r.namespace, r.name, r.code, r.uri, r.user_agent) for r in found] == [
        ("b", "create", "ns", "p0", 201, "/b", "kopf/1.0"), ("c", "delete", "", "", 200, "/c", "kopf/1.0")]
    assert [r.audit_id for r in audit.requests(log, end)] == ["d"]


def test_a_line_the_api_server_is_still_writing_belongs_to_the_next_window(tmp_path: Path):
    log = tmp_path / "audit.log"
    whole = event("a")
    half = event("b")
    log.write_bytes(whole + half[:20])
    assert audit.mark(log) == len(whole)
    assert [r.audit_id for r in audit.requests(log)] == ["a"]
    with open(log, "ab") as out:
        out.write(half[20:])
    assert [r.audit_id for r in audit.requests(log, len(whole))] == ["b"]


def test_a_mark_taken_while_the_api_server_appends_still_ends_on_a_whole_line(tmp_path: Path, monkeypatch):
    # The API server appends between the mark's look at the size and its read of the tail: the
    # tail then holds more than the size said, and counting back from that size landed mid-line.
    log = tmp_path / "audit.log"
    earlier = b"".join(event(f"e{i}") for i in range(400))  # past the tail the mark reads
    log.write_bytes(earlier)

    class AppendingWhileRead:
        def __init__(self, path, mode):
            self.file = open(path, mode)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.file.close()

        def seek(self, offset, whence=0):
            at = self.file.seek(offset, whence)
            if whence == 2:
                with open(log, "ab") as out:
                    out.write(event("late") + event("later")[:30])
            return at

        def read(self, *size):
            return self.file.read(*size)

    monkeypatch.setattr(audit, "open", AppendingWhileRead, raising=False)
    start = audit.mark(log)
    monkeypatch.undo()
    assert start == len(earlier)
    assert [r.audit_id for r in audit.requests(log, start)] == ["late"]


def test_a_mark_refuses_a_tail_without_a_line_end_instead_of_starting_mid_line(tmp_path: Path):
    log = tmp_path / "audit.log"
    log.write_bytes(b"x" * (audit.TAIL_BYTES + 10))
    with pytest.raises(ValueError, match="no line ends in its last 65536 bytes"):
        audit.mark(log)


def test_a_watch_logs_two_events_and_counts_once(tmp_path: Path):
    log = tmp_path / "audit.log"
    log.write_bytes(event("w", "watch", stage="ResponseStarted") + event("g", "get")
                    + event("w", "watch", stage="ResponseComplete"))
    assert audit.count(audit.requests(log)) == {("watch", "pods"): 1, ("get", "pods"): 1}


def test_counts_group_by_the_fields_named_and_keep_only_the_matching_requests(tmp_path: Path):
    log = tmp_path / "audit.log"
    log.write_bytes(event("1", "list", user="op") + event("2", "list", user="op") + event("3", "list", user="kubelet")
                    + event("4", "patch", "ddpjobs", user="op", subresource="status"))
    found = audit.requests(log)
    assert audit.count(found, user="op") == {("list", "pods"): 2, ("patch", "ddpjobs"): 1}
    assert audit.count(found, by=("user",)) == {"op": 3, "kubelet": 1}
    assert audit.count(found, by=("verb",), resource="ddpjobs", subresource="status") == {"patch": 1}


def test_an_unknown_field_is_refused_with_the_fields_a_request_has(tmp_path: Path):
    with pytest.raises(ValueError, match=r"audit fields \['usr'\] unknown: a Request has audit_id, user, verb"):
        audit.count([], usr="op")


@pytest.mark.cluster
@pytest.mark.sandbox_only(AUDIT_LOG)
def test_each_verb_of_one_client_is_counted_as_it_was_sent(control_plane: ControlPlane, kube: KubeClient):
    log = control_plane.layout.audit_log
    start = audit.mark(log)
    created = kube.create("configmaps", {"metadata": {"name": "counted"}})
    kube.get("configmaps", "counted")
    kube.list("configmaps")
    kube.list("configmaps", label_selector="a=b")
    kube.patch("configmaps", "counted", {"metadata": {"labels": {"a": "b"}}})
    watch = urllib.request.Request(f"{kube.url}/api/v1/namespaces/{kube.namespace}/configmaps?watch=true&"
                                   f"timeoutSeconds=1&resourceVersion={created['metadata']['resourceVersion']}")
    with urllib.request.urlopen(watch, context=kube.ssl_context, timeout=10) as stream:
        assert b'"MODIFIED"' in stream.read(), "the watch saw the patch"
    kube.delete("configmaps", "counted")
    expected = {("create", "configmaps"): 1, ("get", "configmaps"): 1, ("list", "configmaps"): 2,
                ("patch", "configmaps"): 1, ("watch", "configmaps"): 1, ("delete", "configmaps"): 1}

    def counted():
        counts = audit.count(audit.requests(log, start), user=ADMIN, namespace=kube.namespace)
        return counts if counts == expected else None

    # The API server writes an event once the response is complete: a moment after the client has it.
    assert kube.wait_for(counted, timeout=10, what=f"{expected} in the audit log") == expected
    assert audit.count(audit.requests(log, start), user="system:node:nobody") == {}, "only the named client's"
