"""What a pod (or the cluster) can make the operator write: the status stays within fixed bounds
and Events stay short and few, however hostile the answers (pure, fixed clock).

A node's /progress answer once grew the job's status by 24 KiB per poll (an unknown key reported
as the field, unshortened) and posted a 24 KiB Warning Event each time: 70 polls made a 1,529 KiB
status, past etcd's object limit, and the job was no longer reconciled.
"""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

from ddpjob_rdzv.contract import progress_record

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.status import DDPJobStatus
from ddpjob_operator.decide import bounds
from ddpjob_operator.decide.actions import Event
from ddpjob_operator.decide.observed import RecordProblem, view_pod
from ddpjob_operator.decide.reconcile import reconcile
from ddpjob_sandbox.jobs import make_ddpjob
from tests.operator.builders import T0, at, make_pod, observe
from tests.operator.topology_builders import unscheduled

POLL_SECONDS = 10.0  # a poll every 10 s: six fresh keys per pod per minute
STATUS_LIMIT = 24 * 1024  # the flood's status stays below this (a healthy running job's is ~1.5 KiB)


def fresh_key_answer(poll: int, node: int) -> str:
    """A /progress answer of MAX_RECORD_BYTES whose one unknown key is new in every poll."""
    key = f"k{poll:05d}n{node}-" + "x" * (progress_record.MAX_RECORD_BYTES - 100)
    answer = json.dumps({"kind": progress_record.KIND, "version": 1, key: 1})
    assert len(answer) <= progress_record.MAX_RECORD_BYTES
    return answer


def refused(pod: dict, answer: str) -> RecordProblem:
    """The poll's reading of a refused answer, as live_progress.py reports it."""
    invalid = progress_record.parse(answer)
    assert isinstance(invalid, progress_record.Invalid)
    return RecordProblem.of(view_pod(pod), C.SOURCE_PROGRESS_ENDPOINT, invalid)


def flood(polls: int, nodes: int = 3):
    """``polls`` passes, each reading a fresh-key answer from every node; returns the last status
    and every (time, Event) posted."""
    job = make_ddpjob(replicas=nodes, elasticPolicy={"rdzvBackend": "etcd", "rdzvEndpoints": ["etcd:2379"]})
    pods = [make_pod(job, i) for i in range(nodes)]
    posted = []
    for poll in range(polls):
        now = at(poll * POLL_SECONDS)
        live = [refused(pod, fresh_key_answer(poll, i)) for i, pod in enumerate(pods)]
        result = reconcile(job, observe(pods, live_progress=live), now)
        job["status"] = result.status
        posted += [(now, e) for e in result.events]
    return job["status"], posted


def status_bytes(status: dict) -> int:
    return len(json.dumps(status, separators=(",", ":")).encode())


def test_a_flood_of_fresh_unknown_keys_keeps_the_status_small():
    status, _ = flood(polls=200)  # 600 refused answers of 24 KiB: 14 MiB sent
    assert status_bytes(status) < STATUS_LIMIT, status_bytes(status)
    assert len(status["invalidProgressRecords"]) <= C.MAX_RECORD_PROBLEMS_KEPT
    assert all(len(e["field"]) <= progress_record.MAX_FIELD_CHARS for e in status["invalidProgressRecords"])
    DDPJobStatus.model_validate(status)  # within every bound the CRD puts on it


def test_a_flood_of_fresh_unknown_keys_posts_at_most_one_short_event_per_pod_per_minute():
    _, posted = flood(polls=60)  # ten minutes
    warned = defaultdict(list)
    for when, event in posted:
        if event.reason == C.REASON_INVALID_PROGRESS_RECORD:
            warned[event.message.split(":")[0]].append(when)
            assert len(event.message) <= C.MAX_EVENT_MESSAGE_CHARS
    assert sorted(warned) == ["node pod mlp-node-0", "node pod mlp-node-1", "node pod mlp-node-2"]
    for times in warned.values():
        gaps = [(later - earlier).total_seconds() for earlier, later in zip(times, times[1:])]
        assert min(gaps) >= C.INVALID_RECORD_WARNING_SECONDS, gaps
        assert len(times) == 10, "still reported, once a minute, while it goes on"


def test_the_refused_key_is_quoted_short_in_the_event():
    _, posted = flood(polls=1, nodes=1)
    [(_, event)] = [(t, e) for t, e in posted if e.reason == C.REASON_INVALID_PROGRESS_RECORD]
    assert event.message.startswith("node pod mlp-node-0: ignored the progress record in its progress endpoint: "
                                    "k00000n0-xxxxxxxxxxxxxxxxxxxxxxxxxxxx... (1) is not a field of")


def test_an_event_message_is_cut_to_its_bound():
    event = Event(C.EVENT_WARNING, "X", "y" * 100_000)
    assert len(event.message) == C.MAX_EVENT_MESSAGE_CHARS and event.message.endswith("...")


def test_hundreds_of_unschedulable_pods_with_long_scheduler_messages_stay_within_the_bounds():
    job = make_ddpjob(replicas=600, elasticPolicy={"rdzvBackend": "etcd", "rdzvEndpoints": ["etcd:2379"]},
                      scheduling={"pendingTimeoutSeconds": 60})
    message = "0/5000 nodes are available: " + ", ".join(f"1 node(s) had taint {{t{i}: x}}" for i in range(2000))
    pods = [unscheduled(job, i, T0, message=message) for i in range(600)]
    result = reconcile(job, observe(pods), at(120))
    status = result.status
    assert len(status["unschedulable"]) == C.MAX_UNSCHEDULABLE
    assert all(len(entry) <= C.MAX_UNSCHEDULABLE_CHARS for entry in status["unschedulable"])
    assert all(len(c["message"]) <= C.MAX_CONDITION_MESSAGE_CHARS for c in status["conditions"])
    assert all(len(e.message) <= C.MAX_EVENT_MESSAGE_CHARS for e in result.events)
    assert status_bytes(status) < 64 * 1024, status_bytes(status)
    DDPJobStatus.model_validate(status)


def test_bounded_keeps_the_newest_entries_and_cuts_strings_at_their_end():
    status = {"failures": [{"pod": f"p{i}", "message": "m" * 5000, "stalledNodes": [str(n) for n in range(100)]}
                           for i in range(30)],
              "handledFailures": [f"uid-{i}" for i in range(C.MAX_HANDLED_FAILURES + 5)], "phase": "Running"}
    cut = bounds.bounded(status)
    assert [f["pod"] for f in cut["failures"]] == [f"p{i}" for i in range(30 - C.MAX_FAILURES_KEPT, 30)]
    assert cut["failures"][0]["message"] == "m" * (C.MAX_FAILURE_MESSAGE_CHARS - 3) + "..."
    assert cut["failures"][0]["stalledNodes"] == [str(n) for n in range(100 - C.MAX_STALLED_NODES, 100)]
    assert cut["handledFailures"][0] == "uid-5" and cut["phase"] == "Running"
    assert bounds.bounded(cut) == cut, "a status within its bounds is left as it is"


@pytest.mark.parametrize("was_valid", [False, True])  # True: it goes on with its last valid spec (last_valid.py)
def test_a_validation_message_over_the_conditions_bound_is_reported_once_not_every_pass(was_valid):
    job = make_ddpjob(replicas=2, elasticPolicy={"rdzvStore": "node"})
    pods = [make_pod(job, 0), make_pod(job, 1)] if was_valid else []
    job["status"] = reconcile(job, observe(pods), at(0)).status if was_valid else None
    job["spec"] = {**job["spec"], "env": [{"name": f"bad name {i} " + "x" * 100, "value": "v"} for i in range(120)]}
    first = reconcile(job, observe(pods), at(10))
    assert first.status["phase"] == (C.PHASE_RUNNING if was_valid else C.PHASE_FAILED)
    [invalid] = [c for c in first.status["conditions"] if c["type"] == C.COND_INVALID_SPEC]
    assert len(invalid["message"]) == C.MAX_CONDITION_MESSAGE_CHARS
    job["status"] = first.status
    again = reconcile(job, observe(pods), at(30))
    assert [e.reason for e in first.events].count(C.REASON_INVALID_SPEC) == 1
    assert [e.reason for e in again.events if e.reason == C.REASON_INVALID_SPEC] == [], "nothing changed"
