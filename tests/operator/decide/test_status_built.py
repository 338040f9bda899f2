"""The status is built, never edited: every rule of decide/status.py reads the previous status
and returns a new one. Proved by running the status tests again with each previous status
deeply frozen (mappings read-only, lists turned into tuples): any write into it, at any depth,
raises, and the previous status must compare equal to a deep copy taken before the pass."""

from __future__ import annotations

import copy
import inspect
import types
from typing import Any, Callable, Mapping

import pytest

from ddpjob_operator.decide import reconcile as reconcile_module
from ddpjob_operator.decide.status import StatusUpdate, compute_status
from tests.operator.builders import job_ref, make_pod, observe, running_pods, at
from tests.operator.decide import (
    test_avoided_nodes, test_capacity_status, test_creation, test_hang, test_history_events, test_last_valid,
    test_log_tail, test_progress_records, test_progress_status, test_status, test_status_bounds, test_straggler,
    test_topology_plan
)
from ddpjob_sandbox.jobs import make_ddpjob


def frozen(value: Any) -> Any:
    """`value` with every mapping read-only and every list a tuple, at every depth."""
    if isinstance(value, Mapping):
        return types.MappingProxyType({k: frozen(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(frozen(v) for v in value)
    return value


def thawed(value: Any) -> Any:
    """A frozen value as the API would return it (dicts and lists), for the tests that go on with it."""
    if isinstance(value, Mapping):
        return {k: thawed(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [thawed(v) for v in value]
    return value


def reading_only(real: Callable[..., StatusUpdate]) -> Callable[..., StatusUpdate]:
    """compute_status, handed a frozen previous status; fails the test if the pass changed it."""
    def compute(ref, spec, observed, previous, now, **kwargs) -> StatusUpdate:
        before = copy.deepcopy(previous)
        update = real(ref, spec, observed, frozen(previous) if previous is not None else None, now, **kwargs)
        assert previous == before, "compute_status changed the previous status"
        return StatusUpdate(thawed(update.status), update.events)
    return compute


# The modules whose tests run a status pass (through test_status.step or decide.reconcile).
MODULES = (test_status, test_progress_status, test_hang, test_straggler, test_capacity_status, test_history_events,
           test_avoided_nodes, test_creation, test_last_valid, test_log_tail, test_progress_records,
           test_status_bounds, test_topology_plan)
CASES = [pytest.param(fn, id=f"{module.__name__.rsplit('.', 1)[-1]}::{name}")
         for module in MODULES for name, fn in vars(module).items()
         if name.startswith("test_") and callable(fn) and not inspect.signature(fn).parameters]


def test_the_status_tests_are_rerun_here():
    assert len(CASES) > 120, "the status tests moved: point MODULES at them"


@pytest.mark.parametrize("case", CASES)
def test_a_pass_never_writes_into_the_previous_status(case, monkeypatch):
    monkeypatch.setattr(test_status, "compute_status", reading_only(compute_status))
    monkeypatch.setattr(reconcile_module, "compute_status", reading_only(compute_status))
    case()


def test_a_frozen_previous_status_is_refused_a_write():
    """The guard itself: a write into a frozen status raises, so a rule that wrote would fail above."""
    status = frozen({"failures": [{"pod": "a"}], "progress": {"step": 1}})
    with pytest.raises(TypeError):
        status["progress"]["step"] = 2
    with pytest.raises(AttributeError):
        status["failures"].append({"pod": "b"})


def test_the_new_status_shares_no_list_with_the_previous_one():
    """Editing the new status (as the writer and the next pass may) leaves the previous one as it was."""
    job = make_ddpjob(replicas=2)
    test_status.step(job, running_pods(job), 0)
    previous = copy.deepcopy(job["status"])
    update = compute_status(job_ref(job), None, observe([make_pod(job, 0)]), job["status"], at(5),
                            errors=[])  # an invalid pass still carries the bookkeeping
    for value in update.status.values():
        if isinstance(value, list):
            value.append("x")
    assert job["status"] == previous
