"""The progress poll against hostile pods: real fake endpoints on loopback, real aiohttp.

Each test asserts bytes and outcomes, never times: how much of the body the poll read
(``Fetched.bytes_read``) and the pod's own count of what it could send before the poll
closed the connection. The pod's count includes what the client's socket buffer took
unread (up to a few hundred KiB on loopback), hence the 1 MiB bounds against 400 MiB bodies.
"""
from __future__ import annotations

import asyncio
import json

import pytest
from ddpjob_rdzv.contract import progress_record

from ddpjob_operator.api import constants as C
from ddpjob_operator.controller import live_progress
from ddpjob_operator.controller.live_progress import CHUNK_BYTES, MAX_BODY_BYTES, fetch, read_live_progress
from ddpjob_operator.decide.observed import RecordProblem, view_pod
from ddpjob_sandbox.jobs import make_ddpjob
from tests.operator.builders import make_pod
from tests.support.fake_pods import FakePod, gzip_bomb, huge_body, record_answer, redirect, trickle
from ddpjob_sandbox.pod_status import progress_message

MIB = 1 << 20
HUGE = 400 * MIB
VALID = progress_message(40, snapshot_time="2026-11-23T01:00:40Z")
BAD_STEP = json.dumps({**json.loads(VALID), "snapshot": {**json.loads(VALID)["snapshot"], "step": "40a"}})


def fetch_once(url, deadline=live_progress.DEADLINE_SECONDS):
    async def run():
        async with live_progress.session() as client:
            return await fetch(client, url, deadline)
    return asyncio.run(run())


def pod_at(fake, index=0):
    """A running node pod whose IP and progress port are the fake pod's."""
    pod = make_pod(make_ddpjob(replicas=2), index)
    pod["status"]["podIP"] = fake.ip
    (port,) = [p for p in pod["spec"]["containers"][0]["ports"] if p["name"] == C.PROGRESS_PORT_NAME]
    port["containerPort"] = fake.port
    return view_pod(pod)


@pytest.fixture
def pods():
    """Fake pods made by the test, closed after it."""
    made = []

    def make(answer):
        made.append(FakePod(answer))
        return made[-1]
    yield make
    for pod in made:
        pod.close()


def test_a_benign_pod_is_read_whole(pods):
    pod = pods(record_answer(VALID))
    fetched = fetch_once(pod.url)
    assert (fetched.body, fetched.refused, fetched.bytes_read) == (VALID.encode(), "", len(VALID))
    assert asyncio.run(read_live_progress([pod_at(pod)])) == [json.loads(VALID)]
    (exchange,) = pod.finished()
    assert exchange.request_headers["accept-encoding"] == "identity"
    assert exchange.closed_by_client, "no keep-alive: the connection ends with the exchange"


def test_a_gzip_bomb_is_refused_unread_and_never_decompressed(pods):
    pod = pods(gzip_bomb(300))
    fetched = fetch_once(pod.url)
    assert fetched.refused == 'Content-Encoding ("gzip") must be identity: the operator does not decompress'
    assert fetched.bytes_read == 0 and fetched.body is None
    (exchange,) = pod.finished()
    assert exchange.request_headers["accept-encoding"] == "identity", "compression was never asked for"
    assert exchange.closed_by_client
    (problem,) = asyncio.run(read_live_progress([pod_at(pod)]))
    assert isinstance(problem, RecordProblem) and problem.invalid.field == "Content-Encoding"


def test_a_declared_huge_body_is_refused_before_reading(pods):
    pod = pods(huge_body(HUGE, declared=True))
    fetched = fetch_once(pod.url)
    assert fetched.refused == f"record ({HUGE} bytes) must be at most 24576 bytes"
    assert fetched.bytes_read == 0
    (exchange,) = pod.finished()
    assert exchange.closed_by_client and exchange.cut_short
    assert exchange.sent < MIB, f"the pod got {exchange.sent} bytes of {HUGE} out"


def test_an_undeclared_huge_body_is_cut_at_the_cap_and_its_connection_closed(pods):
    pod = pods(huge_body(HUGE, declared=False))
    fetched = fetch_once(pod.url)
    assert fetched.refused == "record (over 24576 bytes) must be at most 24576 bytes"
    assert MAX_BODY_BYTES < fetched.bytes_read <= MAX_BODY_BYTES + CHUNK_BYTES
    (exchange,) = pod.finished()
    assert exchange.cut_short, "the pod's next write failed: the poll had closed the connection"
    assert exchange.sent < MIB, f"the pod got {exchange.sent} bytes of {HUGE} out"
    (problem,) = asyncio.run(read_live_progress([pod_at(pod)]))
    assert problem.invalid.message == "record (over 24576 bytes) must be at most 24576 bytes"


def test_a_redirect_is_not_followed_even_to_a_valid_record(pods):
    target = pods(record_answer(VALID))
    pod = pods(redirect(target.url))
    fetched = fetch_once(pod.url)
    assert (fetched.refused, fetched.body, fetched.problem) == ("HTTP 302: redirects are not followed", None, None)
    assert asyncio.run(read_live_progress([pod_at(pod)])) == []
    assert target.exchanges == [], "the redirect target was never asked"


def test_a_trickle_is_cut_by_the_deadline_for_the_whole_exchange(pods):
    pod = pods(trickle(VALID, every=0.05))
    fetched = fetch_once(pod.url, deadline=0.5)
    assert fetched.refused == "no complete answer within 0.5 s" and fetched.body is None
    assert 0 < fetched.bytes_read < len(VALID)
    (exchange,) = pod.finished()
    assert exchange.closed_by_client and exchange.sent < len(VALID)
    assert asyncio.run(read_live_progress([pod_at(pod)], deadline=0.5)) == []


def test_a_refused_record_is_returned_as_a_problem_and_the_next_node_is_asked(pods):
    bad, good = pods(record_answer(BAD_STEP)), pods(record_answer(VALID))
    found = asyncio.run(read_live_progress([pod_at(bad, 0), pod_at(good, 1)]))
    assert found == [RecordProblem("mlp-node-0", "mlp-node-0-uid", C.SOURCE_PROGRESS_ENDPOINT,
                                   progress_record.parse(BAD_STEP)), json.loads(VALID)]
    assert found[0].invalid.message == 'snapshot.step ("40a") must be an integer from 0 to 9007199254740991'


def test_an_error_status_or_an_unreachable_pod_is_no_record(pods):
    missing = pods(None)  # answers 404
    assert fetch_once(missing.url).refused == "HTTP 404"
    closed = FakePod()
    closed.close()
    fetched = fetch_once(closed.url)
    assert fetched.refused.startswith("ClientConnectorError: ") and fetched.body is None
    assert asyncio.run(read_live_progress([pod_at(missing, 0), pod_at(closed, 1)])) == []


def naming(**identity):
    return json.dumps({**json.loads(VALID), **identity})


def test_a_record_naming_its_own_job_and_pod_is_taken(pods):
    fake = pods(None)
    pod = pod_at(fake)
    fake.answer = record_answer(naming(jobUID=pod.controller_uid, pod=pod.name))
    assert asyncio.run(read_live_progress([pod])) == [json.loads(naming(jobUID=pod.controller_uid, pod=pod.name))]


@pytest.mark.parametrize("field, value", [("jobUID", "0000-another-job"), ("pod", "other-node-0")])
def test_a_record_of_another_job_or_pod_is_reported_invalid(pods, field, value):
    """What a pod IP another pod reused answers: a valid record, but not this pod's."""
    fake = pods(None)
    pod = pod_at(fake)
    identity = {"jobUID": pod.controller_uid, "pod": pod.name, field: value}
    fake.answer = record_answer(naming(**identity))
    (problem,) = asyncio.run(read_live_progress([pod]))
    assert isinstance(problem, RecordProblem) and problem.pod == pod.name
    expected = pod.controller_uid if field == "jobUID" else pod.name
    assert problem.invalid.message == f'{field} ("{value}") must be "{expected}": the record of another job or pod'
