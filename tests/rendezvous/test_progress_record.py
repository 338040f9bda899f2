"""The progress record contract (ddpjob_rdzv.contract.progress_record): what passes, what is refused
and why, and that nothing a pod sends can make it raise. Torch-free, like the module."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ddpjob_rdzv.contract import progress_record as P

T = "2026-11-23T01:02:03.456Z"


def record(**fields):
    """A complete version-1 record as the trainer writes it, with ``fields`` replaced."""
    base = {"kind": P.KIND, "version": 1, "node": "1", "written": T,
            "snapshot": {"epoch": 3, "step": 120, "time": "2026-11-23T01:02:00Z",
                         "path": "/snapshots/snapshot-s0000000120-e000003.pt", "samples_consumed": 960},
            "resume": {"time": T, "fromStep": 100, "fromSnapshotTime": "2026-11-23T00:59:00Z", "firstStepTime": T},
            "error": "RuntimeError: boom", "fatal": {"reason": "BadDataset", "message": "checksum mismatch"},
            "nodes": [{"node": "0", "step": 120, "stepSeconds": 0.25, "heartbeat": T}]}
    base.update(fields)
    return base


def message_of(text):
    result = P.parse(text)
    assert isinstance(result, P.Invalid), result
    return result.message


def test_a_complete_record_passes_and_keeps_its_data():
    parsed = P.parse(json.dumps(record()))
    assert isinstance(parsed, P.Record)
    assert parsed.data == record()
    assert parsed.snapshot["step"] == 120 and parsed.resume["fromStep"] == 100
    assert parsed.fatal == {"reason": "BadDataset", "message": "checksum mismatch"}
    assert parsed.error == "RuntimeError: boom"


def test_only_kind_and_version_are_required_and_null_sections_pass():
    assert isinstance(P.parse('{"kind": "ddpjob.progress", "version": 1}'), P.Record)
    minimal = {"kind": P.KIND, "version": 1, "snapshot": None, "resume": None}
    assert P.parse(json.dumps(minimal)).data == minimal


@pytest.mark.parametrize("text", [None, "", "Traceback (most recent call last):\n  ValueError",
                                  '{"kind": "other", "step": "x"}', '["ddpjob"]', '{"step": 3'])
def test_other_text_is_not_a_record(text):
    assert P.parse(text) is None


@pytest.mark.parametrize(("fields", "message"), [
    ({"snapshot": {"epoch": 1, "step": "12a", "time": T, "path": "/s"}},
     'snapshot.step ("12a") must be an integer from 0 to 9007199254740991'),
    ({"snapshot": {"epoch": -1, "step": 1, "time": T, "path": "/s"}},
     "snapshot.epoch (-1) must be an integer from 0 to 9007199254740991"),
    ({"snapshot": {"epoch": 1, "step": 2**53, "time": T, "path": "/s"}},
     "snapshot.step (9007199254740992) must be an integer from 0 to 9007199254740991"),
    ({"snapshot": {"epoch": True, "step": 1, "time": T, "path": "/s"}},
     "snapshot.epoch (true) must be an integer from 0 to 9007199254740991"),
    ({"snapshot": {"epoch": 1, "step": 1.5, "time": T, "path": "/s"}},
     "snapshot.step (1.5) must be an integer from 0 to 9007199254740991"),
    ({"snapshot": {"epoch": 1, "step": 1, "time": "yesterday", "path": "/s"}},
     'snapshot.time ("yesterday") must be an RFC 3339 time such as 2026-01-02T03:04:05Z'),
    ({"snapshot": {"epoch": 1, "step": 1, "time": T}}, "snapshot.path (missing) is required"),
    ({"snapshot": {"epoch": 1, "step": 1, "time": T, "path": "/s", "owner": "me"}},
     'snapshot.owner ("me") is not a field of a version-1 progress record (known: epoch, step, time, path, '
     "samples_consumed)"),
    ({"snapshot": {"epoch": 1, "step": 1, "time": T, "path": "/" * 1025}},
     'snapshot.path ("////////////////////////////////////...) must be a string, at most 1024 characters'),
    ({"snapshot": [1, 2]}, "snapshot ([1, 2]) must be a JSON object"),
    ({"resume": {"time": "2026-02-30T00:00:00Z"}},
     'resume.time ("2026-02-30T00:00:00Z") must be an RFC 3339 time such as 2026-01-02T03:04:05Z'),
    ({"resume": {"firstStepTime": "2026-01-01 00:00:00Z"}},
     'resume.firstStepTime ("2026-01-01 00:00:00Z") must be an RFC 3339 time such as 2026-01-02T03:04:05Z'),
    ({"resume": {"time": "0000-01-01T00:00:00Z"}},
     'resume.time ("0000-01-01T00:00:00Z") must be an RFC 3339 time such as 2026-01-02T03:04:05Z'),
    ({"resume": {"time": "2026-01-01T00:00:60Z"}},
     'resume.time ("2026-01-01T00:00:60Z") must be an RFC 3339 time such as 2026-01-02T03:04:05Z'),
    ({"resume": {"time": "2026-01-01T00:00:00+24:00"}},
     'resume.time ("2026-01-01T00:00:00+24:00") must be an RFC 3339 time such as 2026-01-02T03:04:05Z'),
    ({"version": 2}, "version (2) must be 1"),
    ({"node": "../etc"}, "node (\"../etc\") must be a node index (letters, digits, '.', '_', '-'), at most 63 "
                         "characters"),
    ({"error": "x" * 601}, 'error ("xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...) must be a string, at most 600 characters'),
    ({"fatal": {"reason": "bad reason", "message": "m"}},
     'fatal.reason ("bad reason") must be an UpperCamelCase word such as BadDataset, at most 64 characters'),
    ({"fatal": {"reason": "BadDataset"}}, "fatal.message (missing) is required"),
    ({"nodes": [{"node": "0"}, {"node": "1", "stepSeconds": -1}]},
     "nodes[1].stepSeconds (-1) must be a number of seconds from 0 to 604800"),
    ({"nodes": [{"node": "0"}] * 129}, "nodes (129 entries) must be a list of at most 128 entries"),
    ({"nodes": [{"step": 1}]}, "nodes[0].node (missing) is required"),
    ({"extra": {"a": list(range(20))}}, 'extra ({"a": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, ...) is not a field of a '
                                        "version-1 progress record (known: kind, version, node, jobUID, pod, "
                                        "written, snapshot, resume, error, fatal, nodes)"),
    ({"pod": "mlp node 1"}, "pod (\"mlp node 1\") must be a Kubernetes name or uid (letters, digits, '.', '_', "
                            "'-'), at most 253 characters"),
])
def test_a_record_that_breaks_a_rule_is_refused_naming_field_value_and_rule(fields, message):
    assert message_of(json.dumps(record(**fields))) == message


def test_times_take_any_offset_up_to_nine_fraction_digits_and_real_dates_only():
    for moment in ("2026-11-23T01:02:03Z", "2026-11-23T01:02:03.1+05:30", "2026-11-23T01:02:03.123456789-08:00",
                   "2024-02-29T00:00:00Z", "2026-12-31T23:59:59-23:59"):
        assert isinstance(P.parse(json.dumps(record(written=moment))), P.Record), moment
    for moment in ("2026-02-29T00:00:00Z", "2026-04-31T00:00:00Z", "2026-13-01T00:00:00Z", "2026-01-01T24:00:00Z"):
        assert P.parse(json.dumps(record(written=moment))).field == "written", moment


@pytest.mark.parametrize(("text", "message"), [
    ('{"kind": "ddpjob.progress", "version": 1, "x": NaN}',
     'record ({"kind": "ddpjob.progress", "version"...) must be a JSON object (NaN is not a JSON number)'),
    ('{"kind": "ddpjob.progress", "version": 1, "x": -Infinity}',
     'record ({"kind": "ddpjob.progress", "version"...) must be a JSON object (-Infinity is not a JSON number)'),
    ('{"kind": "ddpjob.progress", "version": 1, "nodes": [{"node": "0", "stepSeconds": 1e999}]}',
     "nodes[0].stepSeconds (Infinity) must be a number of seconds from 0 to 604800"),
    ('{"kind": "ddpjob.progress", "version": 1, ',
     'record ({"kind": "ddpjob.progress", "version"...) must be a JSON object (Expecting property name '
     "enclosed in double quotes: line 1 column 43 (char 42))"),
])
def test_text_that_names_the_kind_but_is_not_strict_json_is_refused(text, message):
    assert message_of(text) == message


def test_a_record_over_the_cap_is_refused_before_it_is_decoded():
    text = json.dumps(record(error="")) + " " * P.MAX_RECORD_BYTES
    assert message_of(text) == f"record ({len(text)} bytes) must be at most 24576 bytes"
    assert message_of(text.encode()) == f"record ({len(text)} bytes) must be at most 24576 bytes"


def test_bytes_must_be_utf8():
    data = b'{"kind": "ddpjob.progress", "version": 1, "node": "\xff"}'
    assert message_of(data) == "record (byte 51) must be UTF-8 text"
    assert isinstance(P.parse(json.dumps(record()).encode()), P.Record)


@pytest.mark.parametrize("text", [
    '{"kind": "ddpjob.progress", "x": ' + "[" * 50_000,  # deep nesting: json raises RecursionError
    '{"kind": "ddpjob.progress", "x": ' + "[" * 5_000 + "]" * 5_000 + "}",
    '{"kind": "ddpjob.progress", "version": 1, "snapshot": {"step": ' + "9" * 5000 + "}}",  # int digit limit
    '{"kind": "ddpjob.progress", "version": 1, "node": "\ud800"}',  # a lone surrogate
    '{"kind": "ddpjob.progress", "version": 1, "fatal": "BadDataset"}',
    '{"kind": "ddpjob.progress", "version": 1, "nodes": {"node": "0"}}',
    '{"kind": "ddpjob.progress", "version": 1, "resume": {"time": 20261123}}',
])
def test_hostile_input_is_refused_and_never_raises(text):
    assert isinstance(P.parse(text), P.Invalid)


# --- the writer's side ----------------------------------------------------------------------


def test_a_new_record_encodes_compact_with_kind_first_and_parses_back():
    fresh = P.new_record("2", T)
    data = P.encode(fresh)
    assert data.startswith(b'{"kind":"ddpjob.progress","version":1,') and b" " not in data
    assert P.parse(data).data == fresh


def test_encode_refuses_an_invalid_record_naming_the_field():
    with pytest.raises(ValueError) as error:
        P.encode(record(snapshot={"epoch": 1, "step": -3, "time": T, "path": "/s"}))
    assert str(error.value) == ("not a valid progress record: snapshot.step (-3) must be an integer "
                                "from 0 to 9007199254740991")


def test_encode_fits_a_termination_message_dropping_nodes_then_shortening_the_free_text():
    nodes = [{"node": str(i), "step": 10**9, "stepSeconds": 1.25, "heartbeat": T} for i in range(100)]
    big = record(nodes=nodes, error="\u00e9" * 600, fatal={"reason": "BadDataset", "message": "\u2603" * 600})
    assert len(P.encode(big)) > P.TERMINATION_MESSAGE_BYTES, "the endpoint keeps everything"
    data = P.encode(big, P.TERMINATION_MESSAGE_BYTES)
    assert len(data) <= P.TERMINATION_MESSAGE_BYTES
    kept = P.parse(data).data
    assert kept == {k: v for k, v in big.items() if k != "nodes"}, "without nodes it fits: nothing else is cut"
    cut = P.parse(P.encode(big, 3000)).data
    assert cut["fatal"] == big["fatal"], "the error is cut first"
    assert cut["error"].endswith("...") and cut["error"][:-3] == "\u00e9" * (len(cut["error"]) - 3)
    tight = P.encode(big, 1200)
    assert len(tight) <= 1200
    assert P.parse(tight).data["error"] == "" and P.parse(tight).data["fatal"]["message"].endswith("...")


def test_encode_says_when_a_record_cannot_fit():
    with pytest.raises(ValueError) as error:
        P.encode(record(error=""), 100)
    assert str(error.value).startswith("the progress record (") and str(error.value).endswith(
        " bytes) must be at most 100 bytes")


def test_progress_json_and_reasons_are_checked_on_their_own():
    assert P.check_snapshot(record()["snapshot"]) is None
    assert P.check_snapshot({"epoch": 0, "step": 0, "time": "soon", "path": "/s"}).message == (
        'snapshot.time ("soon") must be an RFC 3339 time such as 2026-01-02T03:04:05Z')
    assert P.check_reason("BadDataset") is None
    assert P.check_reason("bad").message == (
        'fatal.reason ("bad") must be an UpperCamelCase word such as BadDataset, at most 64 characters')


def test_the_contract_imports_neither_torch_nor_pydantic():
    code = "import sys, ddpjob_rdzv.contract.progress_record; print(sorted({'torch', 'pydantic'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize(("where", "prefix"), [((), ""), (("snapshot",), "snapshot."), (("nodes", 0), "nodes[0].")])
def test_an_unknown_key_is_quoted_short_in_the_field_wherever_it_stands(where, prefix):
    key = "k" + "x" * (P.MAX_RECORD_BYTES - 600)  # the reader's status and Events keep the field
    body = record(snapshot={"epoch": 1, "step": 1, "time": T, "path": "/s"}, nodes=[{"node": "0"}])
    target = body
    for step in where:
        target = target[step]
    target[key] = 1
    refused = P.parse(json.dumps(body))
    assert refused.field == prefix + "k" + "x" * (P.KEY_CHARS - 4) + "..."
    assert len(refused.field) <= P.MAX_FIELD_CHARS and len(refused.message) < 400
