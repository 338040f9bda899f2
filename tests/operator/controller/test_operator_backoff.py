"""Backoff after API errors: the delay doubles from 2 s to a 5 min cap, honours Retry-After and
starts over after a success; refused creates are kept for the next pass to report (pure, fake clock)."""
from __future__ import annotations

import pytest

from ddpjob_operator.controller.backoff import CAP_SECONDS, Backoff, CreateRetries, delay_after
from ddpjob_operator.decide.creation import CreateFailure

QUOTA = CreateFailure("Pod", "mlp-node-1", 403, "Forbidden", 'pods "mlp-node-1" is forbidden: exceeded quota: q')


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_the_delay_doubles_from_two_seconds_up_to_five_minutes():
    assert [delay_after(n) for n in range(1, 11)] == [2, 4, 8, 16, 32, 64, 128, 256, 300, 300]
    assert delay_after(10_000) == CAP_SECONDS


@pytest.mark.parametrize("failures, retry_after, expected", [(1, 30, 30), (8, 30, 256), (1, 3600, 300), (2, None, 4)])
def test_retry_after_is_honoured_up_to_the_cap(failures, retry_after, expected):
    assert delay_after(failures, retry_after) == expected


def test_each_key_backs_off_alone_and_a_success_starts_over():
    clock = Clock()
    backoff = Backoff(clock=clock)
    assert [backoff.failed("a") for _ in range(3)] == [2, 4, 8]
    assert backoff.remaining("a") == 8 and backoff.remaining("b") == 0
    clock.now += 5
    assert backoff.remaining("a") == 3
    backoff.succeeded("a")
    assert (backoff.remaining("a"), backoff.failed("a")) == (0, 2)


def test_refused_creates_are_kept_with_their_count_and_hold_the_jobs_creates():
    clock = Clock()
    creates = CreateRetries(Backoff(clock=clock))
    assert creates.last("job") is None and creates.hold("job") == 0
    creates.failed("job", QUOTA)
    assert creates.failed("job", QUOTA) == 4
    assert creates.last("job") == CreateFailure(**{**QUOTA.__dict__, "attempts": 2})
    assert creates.hold("job") == 4 and creates.hold("other") == 0
    creates.retry_now("job")  # the job was edited: try at once, still report the refusal
    assert creates.hold("job") == 0 and creates.last("job").attempts == 2
    creates.succeeded("job")
    assert creates.last("job") is None
