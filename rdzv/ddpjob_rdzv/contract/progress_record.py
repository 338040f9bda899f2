"""The progress record: what a trainer tells the operator, and the rules both sides check.

The local-rank-0 worker of every node keeps one record (ddpjob_trainer/report/record.py)
and publishes it two ways: in the container's termination message, which the kubelet
copies into the pod status when the container exits, and at ``GET /progress`` while the
worker runs, which the operator polls (ddpjob_operator/controller/live_progress.py). The
operator reads both with :func:`parse`; the trainer builds them with :func:`new_record`
and :func:`encode`. One module, so the two sides cannot drift apart.

Version 1 (every key but ``kind`` and ``version`` may be left out; ``null`` where shown)::

    {"kind": "ddpjob.progress", "version": 1,
     "node": "2",                                   # DDPJOB_NODE_INDEX of the writer
     "jobUID": "6f1c2a9e-...", "pod": "mlp-node-2", # DDPJOB_JOB_UID and DDPJOB_POD_NAME: whose record it is
     "written": "2026-11-23T01:02:03.456Z",         # when this copy was written
     "snapshot": {"epoch": 3, "step": 120, "time": "<RFC 3339>", "path": "/snapshots/...",
                  "samples_consumed": 0} | null,    # <snapshot dir>/progress.json, the newest complete one
     "resume": {"time": <t>, "fromStep": 100, "fromSnapshotTime": <t>, "firstStepTime": <t>,
                "workerRestarts": 1} | null,                # TORCHELASTIC_RESTART_COUNT of this run
     "error": "RuntimeError: ...",                  # training raised (type and message)
     "fatal": {"reason": "BadDataset", "message": "..."},  # the worker says: do not retry
     "nodes": [{"node": "0", "step": 120, "phase": "collective", "stepSeconds": 0.25,
                "dataSeconds": 0.01, "computeSeconds": 0.05, "heartbeat": <t>}, ...]}

``nodes`` is every node's liveness, gathered by the writer from the ranks' heartbeats in
the c10d store (ddpjob_trainer/report/record.py, docs/hangs.md): per node, the lowest step
its ranks finished, the median recent step time of its slowest rank, that rank's time
waiting for input (``dataSeconds``: from the end of a step to its next batch in hand) and in
the forward pass (``computeSeconds``: the part of a step before its first collective), and
its oldest rank's last heartbeat, and ``phase``: ``local`` when one of its ranks is outside
the step's collectives (input, forward, the script's code), else ``collective``. At most
MAX_NODES entries, and
:func:`encode` drops the list first when a record must shrink.

Why the rules: the operator polls pods it does not trust (user code runs there) and a
malformed record used to make every reconciliation pass raise. So a record is checked
before anything reads it: known keys only, types, string lengths, integers within
0..MAX_COUNT, RFC 3339 times, and at most MAX_RECORD_BYTES in all. A record that breaks
a rule is :class:`Invalid`, which names the field, the value (shortened) and the rule;
the operator drops it and says so in a Warning Event. Plain Python: this package is
shared by the trainer and the operator and depends on neither torch nor pydantic.
"""
from __future__ import annotations

import calendar
import datetime
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

KIND = "ddpjob.progress"  # marks our record among other termination messages (a log tail, say)
VERSION = 1  # the record layout this module reads and writes
# The poll reads at most this much of a response and parse() refuses anything longer. A
# record is ~400 bytes without `nodes`; the room is for 128 entries of at most ~170 bytes.
MAX_RECORD_BYTES = 24 * 1024
TERMINATION_MESSAGE_BYTES = 4096  # the kubelet keeps at most this much of a termination message
MAX_COUNT = 2**53 - 1  # step, epoch, samples: the largest integer every JSON reader keeps exactly
MAX_STEP_SECONDS = 7 * 24 * 3600.0  # a step longer than a week is a broken clock, not a slow model
MAX_ERROR_CHARS = 600  # error and fatal.message: enough for a type and a message, far below 4096 bytes
MAX_PATH_CHARS = 1024  # a snapshot path inside the snapshot volume
MAX_NODE_CHARS = 63  # a node index as text (a label value's length)
MAX_NAME_CHARS = 253  # jobUID and pod: a Kubernetes object name (or uid) at its longest
MAX_NODES = 128  # entries in `nodes`
MAX_TIME_CHARS = 40  # '2026-11-23T01:02:03.123456789+00:00' is 35
VALUE_CHARS = 40  # how much of an offending value an explanation quotes
# How much of an unknown key a field path quotes: the key is the writer's, up to MAX_RECORD_BYTES,
# and the operator keeps the path in the job's status and an Event. The longest path is then
# "nodes[127]." and this: MAX_FIELD_CHARS in all.
KEY_CHARS = 40
MAX_FIELD_CHARS = 64

_NODE = re.compile(r"[A-Za-z0-9._-]*")
_REASON = re.compile(r"[A-Z][A-Za-z0-9]{0,63}")  # UpperCamelCase, like every Kubernetes reason
# RFC 3339 date-time as Kubernetes writes it (upper-case T and Z), 1-9 fraction digits, every
# field in range (no leap second: Python's datetime has none). The pattern does the range
# checks so that only days 29-31 need a calendar: a record may hold 260 times.
_TIME = re.compile(r"((?!0000)\d{4})-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])T([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,9})?"
                   r"(Z|[+-]([01]\d|2[0-3]):[0-5]\d)")


@dataclass(frozen=True)
class Invalid:
    """Why a record was refused: ``field`` (a path such as ``snapshot.step``), the value as
    text (shortened) and the rule it breaks."""

    field: str
    value: str
    rule: str

    @property
    def message(self) -> str:
        return f"{self.field} ({self.value}) {self.rule}"


@dataclass(frozen=True)
class Record:
    """A record that passed every rule; ``data`` is the decoded JSON object."""

    data: Mapping[str, Any]

    @property
    def snapshot(self) -> Mapping[str, Any] | None:
        return self.data.get("snapshot")

    @property
    def resume(self) -> Mapping[str, Any] | None:
        return self.data.get("resume")

    @property
    def error(self) -> str | None:
        return self.data.get("error")

    @property
    def fatal(self) -> Mapping[str, str] | None:
        """{reason, message} when the worker said retrying cannot help."""
        return self.data.get("fatal")


# --- Reading -------------------------------------------------------------------------------

def parse(data: str | bytes | None) -> Record | Invalid | None:
    """The record in a termination message or a /progress response body.

    Returns:
        a Record; an Invalid when the text is (or claims to be, by naming KIND) a progress
        record but breaks a rule; None when it is something else (empty, a log tail, another
        program's JSON). Never raises, whatever the input.
    """
    if not data:
        return None
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as error:
            return Invalid("record", f"byte {error.start}", "must be UTF-8 text") if KIND.encode() in data else None
    else:
        text = data
    if not text.lstrip().startswith("{"):
        return None
    claimed = KIND in text
    size = len(text) if len(text) > MAX_RECORD_BYTES else len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_RECORD_BYTES:
        return Invalid("record", f"{size} bytes", f"must be at most {MAX_RECORD_BYTES} bytes") if claimed else None
    try:
        decoded = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as error:  # deep nesting raises RecursionError, not ValueError
        rule = f"must be a JSON object ({shorten(str(error), 80)})"
        return Invalid("record", shorten(text), rule) if claimed else None
    if not isinstance(decoded, dict) or decoded.get("kind") != KIND:
        return None
    return validate(decoded)


def validate(record: Mapping[str, Any]) -> Record | Invalid:
    """Checks a decoded record against every rule; the first broken one is returned."""
    return _RECORD("", record) or Record(record)


def check_snapshot(snapshot: Any) -> Invalid | None:
    """Checks progress.json (a record's ``snapshot``) on its own: the trainer copies it in."""
    return _SNAPSHOT("snapshot", snapshot)


def check_node_entry(entry: Any) -> Invalid | None:
    """Checks one ``nodes`` entry on its own: a rank's heartbeat has its layout, and the trainer
    checks each before folding it in (one malformed heartbeat must not stop the others)."""
    return _NODE_FIGURES("nodes[]", entry)


def check_reason(reason: Any) -> Invalid | None:
    """Checks a ``fatal.reason`` (the trainer checks it when DoNotRetry is raised)."""
    return _reason("fatal.reason", reason)


# --- Writing -------------------------------------------------------------------------------

def now() -> str:
    """The current UTC time in RFC 3339 with milliseconds, as records carry it."""
    moment = datetime.datetime.now(datetime.timezone.utc)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def new_record(node: str, started: str) -> dict[str, Any]:
    """The record of a worker that started at ``started`` and has done nothing yet."""
    return {"kind": KIND, "version": VERSION, "node": node, "snapshot": None,
            "resume": {"time": started, "fromStep": None, "fromSnapshotTime": None, "firstStepTime": None}}


def encode(record: Mapping[str, Any], max_bytes: int = MAX_RECORD_BYTES) -> bytes:
    """``record`` as compact UTF-8 JSON of at most ``max_bytes``: when too long, ``nodes`` is
    dropped first, then ``error`` and ``fatal.message`` are shortened (their ends cut).

    Raises:
        ValueError: the record breaks a rule (the message names field, value and rule), or
            is still longer than ``max_bytes`` after shrinking.
    """
    problem = _RECORD("", record)
    if problem is not None:
        raise ValueError(f"not a valid progress record: {problem.message}")
    data = _dumps(record)
    if len(data) > max_bytes and "nodes" in record:
        record = {k: v for k, v in record.items() if k != "nodes"}
        data = _dumps(record)
    for path in (("error",), ("fatal", "message")):
        while len(data) > max_bytes and _text_at(record, path):
            raw = _text_at(record, path).encode()
            # Cut the excess in UTF-8 bytes (a partial character is dropped); JSON escapes make
            # some characters longer still, so the loop checks again.
            keep = max(len(raw) - (len(data) - max_bytes) - 3, 0)
            text = raw[:keep].decode(errors="ignore")
            record = _with_text(record, path, text + "..." if text else "")
            data = _dumps(record)
    if len(data) > max_bytes:
        raise ValueError(f"the progress record ({len(data)} bytes) must be at most {max_bytes} bytes")
    return data


def _dumps(record: Mapping[str, Any]) -> bytes:
    return json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode()


def _text_at(record: Mapping[str, Any], path: tuple[str, ...]) -> str:
    value: Any = record
    for key in path:
        value = value.get(key) if isinstance(value, Mapping) else None
    return value if isinstance(value, str) else ""


def _with_text(record: Mapping[str, Any], path: tuple[str, ...], text: str) -> dict[str, Any]:
    if len(path) == 1:
        return {**record, path[0]: text}
    return {**record, path[0]: _with_text(record[path[0]], path[1:], text)}


# --- The rules -------------------------------------------------------------------------------
# A check takes the field's path and its value and returns an Invalid, or None when it passes.

Check = Callable[[str, Any], "Invalid | None"]


def _show(value: Any) -> str:
    """A value as JSON text (a string in quotes), on one line and at most VALUE_CHARS long."""
    return shorten(_json_or_repr(value))


def shorten(text: str, limit: int = VALUE_CHARS) -> str:
    """``text`` on one line and at most ``limit`` characters, for quoting in an explanation."""
    text = " ".join(text.split())  # one line, whatever the value held
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _json_or_repr(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        return repr(value)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _bad(path: str, value: Any, rule: str) -> Invalid:
    return Invalid(path, _show(value), rule)


def _integer(path: str, value: Any) -> Invalid | None:
    if type(value) is not int or not 0 <= value <= MAX_COUNT:  # bool is an int to Python, not to us
        return _bad(path, value, f"must be an integer from 0 to {MAX_COUNT}")
    return None


def _seconds(path: str, value: Any) -> Invalid | None:
    if type(value) not in (int, float) or not math.isfinite(value) or not 0 <= value <= MAX_STEP_SECONDS:
        return _bad(path, value, f"must be a number of seconds from 0 to {MAX_STEP_SECONDS:g}")
    return None


def _time(path: str, value: Any) -> Invalid | None:
    match = _TIME.fullmatch(value) if isinstance(value, str) and len(value) <= MAX_TIME_CHARS else None
    if match is not None and match.group(3) > "28":
        year, month, day = int(match.group(1)), int(match.group(2)), int(match.group(3))
        match = match if day <= calendar.monthrange(year, month)[1] else None
    if match is None:
        return _bad(path, value, "must be an RFC 3339 time such as 2026-01-02T03:04:05Z")
    return None


def _text(limit: int, pattern: re.Pattern | None = None, what: str = "") -> Check:
    def check(path: str, value: Any) -> Invalid | None:
        if not isinstance(value, str) or len(value) > limit or (pattern and not pattern.fullmatch(value)):
            return _bad(path, value, f"must be {what or 'a string'}, at most {limit} characters")
        return None
    return check


_reason = _text(64, _REASON, "an UpperCamelCase word such as BadDataset")
_node = _text(MAX_NODE_CHARS, _NODE, "a node index (letters, digits, '.', '_', '-')")
_name = _text(MAX_NAME_CHARS, _NODE, "a Kubernetes name or uid (letters, digits, '.', '_', '-')")


def _exactly(expected: Any) -> Check:
    def check(path: str, value: Any) -> Invalid | None:
        if type(value) is not type(expected) or value != expected:
            return _bad(path, value, f"must be {json.dumps(expected)}")
        return None
    return check


def _nullable(check: Check) -> Check:
    return lambda path, value: None if value is None else check(path, value)


def _object(fields: Mapping[str, Check], required: tuple[str, ...] = ()) -> Check:
    """An object with only these keys, the ``required`` ones present, each passing its check."""
    def check(path: str, value: Any) -> Invalid | None:
        if not isinstance(value, Mapping):
            return _bad(path or "record", value, "must be a JSON object")
        prefix = f"{path}." if path else ""
        for key in required:
            if key not in value:
                return Invalid(prefix + key, "missing", "is required")
        for key in value:
            if key not in fields:
                return _bad(prefix + shorten(str(key), KEY_CHARS), value[key],
                            f"is not a field of a version-{VERSION} progress record (known: {', '.join(fields)})")
        for key, field_check in fields.items():
            problem = field_check(prefix + key, value[key]) if key in value else None
            if problem is not None:
                return problem
        return None
    return check


def _list_of(item: Check, limit: int) -> Check:
    def check(path: str, value: Any) -> Invalid | None:
        if not isinstance(value, list) or len(value) > limit:
            shown = f"{len(value)} entries" if isinstance(value, list) else _show(value)
            return Invalid(path, shown, f"must be a list of at most {limit} entries")
        return next((p for i, entry in enumerate(value) if (p := item(f"{path}[{i}]", entry))), None)
    return check


_SNAPSHOT = _object({"epoch": _integer, "step": _integer, "time": _time, "path": _text(MAX_PATH_CHARS),
                     "samples_consumed": _integer}, required=("epoch", "step", "time", "path"))
_RESUME = _object({"time": _nullable(_time), "fromStep": _nullable(_integer),
                   "fromSnapshotTime": _nullable(_time), "firstStepTime": _nullable(_time),
                   "workerRestarts": _nullable(_integer)})
_FATAL = _object({"reason": _reason, "message": _text(MAX_ERROR_CHARS)}, required=("reason", "message"))
_PHASE = _text(10, re.compile(r"local|collective"), "local or collective")
_NODE_FIGURES = _object({"node": _node, "step": _nullable(_integer), "phase": _PHASE,
                         "stepSeconds": _nullable(_seconds), "dataSeconds": _nullable(_seconds),
                         "computeSeconds": _nullable(_seconds), "heartbeat": _nullable(_time)}, required=("node",))
_RECORD = _object({
    "kind": _exactly(KIND), "version": _exactly(VERSION),
    "node": _node, "jobUID": _name, "pod": _name, "written": _nullable(_time),
    "snapshot": _nullable(_SNAPSHOT), "resume": _nullable(_RESUME),
    "error": _text(MAX_ERROR_CHARS), "fatal": _FATAL, "nodes": _list_of(_NODE_FIGURES, MAX_NODES),
}, required=("kind", "version"))
