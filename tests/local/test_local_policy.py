"""A local node's exit goes through the operator's failure policy, with the operator's messages."""
import pytest

from ddpjob_operator.decide.failure import describe_exit, signal_name
from ddpjob_operator.local.policy import (
    HOLD_FOR_SURVIVORS_SECONDS, Action, FailureBudget, container_exit_code, hold_replacements
)
from ddpjob_operator.api.spec import FailurePolicy
from tests.operator.builders import at


def budget(**policy):
    return FailureBudget(FailurePolicy(**policy))


@pytest.mark.parametrize("returncode, code", [(0, 0), (1, 1), (-9, 137), (-15, 143)])
def test_death_by_signal_reads_as_a_container_exit_code(returncode, code):
    assert container_exit_code(returncode) == code


def test_exit_descriptions_name_the_node_the_code_and_the_signal():
    assert describe_exit("node 1", 137, signal_name(137)) == "node 1 failed (exit code 137, SIGKILL)"
    assert describe_exit("node 0", 1, signal_name(1)) == "node 0 failed (exit code 1)"
    assert describe_exit("node pod mlp-node-1", 137, "OOMKilled") == "node pod mlp-node-1 failed (exit code 137, OOMKilled)"


def test_exit_0_finishes():
    decision = budget().node_exited(0, 0, started_at=at(0), failed_at=at(50))
    assert decision.action == Action.FINISHED


def test_a_permanent_exit_code_fails_the_run_at_once_without_using_the_budget():
    b = budget(permanent_exit_codes=[126, 127])
    decision = b.node_exited(1, 127, started_at=at(0), failed_at=at(5))
    assert decision.action == Action.FAIL
    assert decision.message == ("node 1 failed (exit code 127); "
                                "the code is in spec.failurePolicy.permanentExitCodes")
    assert b.restarts == 0


def test_a_retryable_failure_is_counted_and_the_first_is_replaced_at_once_the_next_after_the_backoff():
    b = budget(backoff_seconds=10, max_backoff_seconds=300)
    decision = b.node_exited(1, 137, started_at=at(0), failed_at=at(30))
    assert (decision.action, decision.delay, b.restarts) == (Action.REPLACE, 0.0, 1)
    assert decision.message == ("node 1 failed (exit code 137, SIGKILL); "
                                "1 of spec.failurePolicy.maxRestarts (5) used")
    again = b.node_exited(1, 137, started_at=at(31), failed_at=at(40))  # the replacement crashed too
    assert (again.action, again.delay, b.restarts) == (Action.REPLACE, 10.0, 2)


def test_a_node_lost_with_its_machine_is_free_and_replaced_at_once_as_the_operator_does():
    b = budget(backoff_seconds=10, max_backoff_seconds=300)
    decision = b.node_exited(1, 137, started_at=at(0), failed_at=at(30), lost=True)
    assert (decision.action, decision.delay, b.restarts, b.charged) == (Action.REPLACE, 0.0, 0, 0)
    assert decision.message == ("node 1 failed (exit code 137, NodeLost); "
                                "disruptions do not use the restart budget")


def test_a_lost_node_still_waits_out_the_backoff_of_an_incident_that_is_running():
    b = budget(backoff_seconds=10, max_backoff_seconds=300)
    b.node_exited(0, 1, started_at=at(0), failed_at=at(20))  # a crash: replaced at once
    b.node_exited(0, 1, started_at=at(21), failed_at=at(30))  # its replacement's crash: 10 s backoff
    decision = b.node_exited(1, 137, started_at=at(0), failed_at=at(34), lost=True)
    assert (decision.action, decision.delay, b.restarts) == (Action.REPLACE, 6.0, 2)


def test_the_backoff_doubles_with_each_new_incident_and_is_capped():
    b = budget(backoff_seconds=10, max_backoff_seconds=25)
    delays = []
    for n in range(4):
        start = at(100 * n)
        delays.append(b.node_exited(1, 1, started_at=start, failed_at=at(100 * n + 50)).delay)
    assert delays == [0.0, 10.0, 20.0, 25.0]


def test_nodes_failing_together_are_one_incident_and_share_its_backoff():
    b = budget(backoff_seconds=10)
    b.node_exited(0, 1, started_at=at(0), failed_at=at(50))  # the first incident: replaced at once
    first = b.node_exited(0, 1, started_at=at(60), failed_at=at(100))
    second = b.node_exited(1, 1, started_at=at(0), failed_at=at(102))  # the store host's cascade
    assert b.restarts == 2
    assert (first.delay, second.delay) == (10.0, 8.0)


def test_a_replacement_that_fails_again_is_a_new_incident():
    b = budget()
    b.node_exited(1, 1, started_at=at(0), failed_at=at(100))
    b.node_exited(1, 1, started_at=at(110), failed_at=at(112))
    assert b.restarts == 2


def test_one_incident_more_than_max_restarts_fails_the_run():
    b = budget(max_restarts=1)
    assert b.node_exited(1, 1, started_at=at(0), failed_at=at(100)).action == Action.REPLACE
    decision = b.node_exited(1, 1, started_at=at(110), failed_at=at(200))
    assert decision.action == Action.FAIL
    assert decision.message == "2 failure incidents exceed spec.failurePolicy.maxRestarts (1)"


def test_a_failure_after_training_finished_is_not_replaced_nor_counted():
    b = budget()
    decision = b.node_exited(1, 143, started_at=at(0), failed_at=at(100), finished=True)
    assert decision.action == Action.NONE and b.restarts == 0


def test_a_late_replacement_on_the_closed_rendezvous_cannot_fail_a_finished_run():
    """torch's agent ends a node that reaches a rendezvous closed on success with exit 1; even a
    code listed as permanent, or one over a spent budget, leaves the finished nodes' verdict."""
    b = budget(permanent_exit_codes=[1], max_restarts=0)
    decision = b.node_exited(1, 1, started_at=at(90), failed_at=at(100), finished=True)
    assert (decision.action, b.restarts, b.charged) == (Action.NONE, 0, 0)
    assert decision.message == ("node 1 failed (exit code 1) after training finished; not counted: "
                                "the nodes that finished decide the job's result")
    assert b.store_exited(1, started_at=at(0), failed_at=at(100), finished=True).action == Action.NONE
    assert b.node_exited(1, 1, started_at=at(0), failed_at=at(100)).action == Action.FAIL, "before: permanent"


def test_any_exit_of_the_rendezvous_store_is_a_failure_that_restarts_the_group():
    b = budget(backoff_seconds=10)
    decision = b.store_exited(0, started_at=at(0), failed_at=at(50))
    assert (decision.action, decision.delay, b.restarts) == (Action.REPLACE, 0.0, 1)
    assert decision.what == "the rendezvous store failed (exit code 0)"


HOLD = dict(now=20.0, failed_at=10.0, first_step=5.0, last_step=9.0, running=1, min_replicas=1)


@pytest.mark.parametrize("change, held", [
    ({}, True),  # the survivor has not stepped since the failure: it is re-forming the group
    ({"last_step": 15.0}, False),  # it resumed: the replacement joins a training group
    ({"running": 0}, False),  # nobody survived (a group restart): nothing to wait for
    ({"running": 1, "min_replicas": 2}, False),  # the survivors cannot train without it
    ({"first_step": None, "last_step": None}, False),  # no metrics at all: never wait
    ({"failed_at": None}, False),
    ({"now": 10.0 + HOLD_FOR_SURVIVORS_SECONDS}, False),  # waited long enough
    ({"survivors_wait": True}, False),  # the survivors hold their round open for it (replacementWaitSeconds)
])
def test_due_replacements_wait_only_for_survivors_that_are_re_forming(change, held):
    assert hold_replacements(**{**HOLD, **change}) is held


def snap(step, second):
    return {"step": step, "epoch": 0, "time": f"2026-01-01T12:00:{second:02d}Z"}


def test_a_failure_after_a_newer_snapshot_is_not_charged_and_is_replaced_at_once():
    b = budget(max_restarts=1, backoff_seconds=10)
    first = b.node_exited(1, 137, started_at=at(0), failed_at=at(20), snapshot=snap(40, 10))
    looped = b.node_exited(1, 137, started_at=at(21), failed_at=at(30), snapshot=snap(40, 10))
    second = b.node_exited(1, 137, started_at=at(40), failed_at=at(50), snapshot=snap(80, 45))
    assert [d.action for d in (first, looped, second)] == [Action.REPLACE] * 3
    assert (b.restarts, b.charged) == (3, 1)
    assert second.message == ("node 1 failed (exit code 137, SIGKILL); 1 of "
                              "spec.failurePolicy.maxRestarts (1) used; not charged: a newer snapshot (step 80) was complete")
    # the crash without progress backed off; progress starts the streak over: at once, not 20 s
    assert [d.delay for d in (first, looped, second)] == [0.0, 10.0, 0.0]


def test_failures_in_a_row_without_a_newer_snapshot_fail_with_no_progress():
    b = budget(max_restarts=10, max_restarts_without_progress=1)
    b.node_exited(1, 1, started_at=at(0), failed_at=at(20), snapshot=snap(40, 10))  # progress: free
    b.node_exited(1, 1, started_at=at(30), failed_at=at(100), snapshot=snap(40, 10))  # none: 1 in a row
    decision = b.node_exited(1, 1, started_at=at(110), failed_at=at(200), snapshot=snap(40, 10))
    assert decision.action == Action.FAIL
    assert decision.message == ("2 failure incidents in a row without a newer snapshot (still at step 40, epoch 0) "
                                "exceed spec.failurePolicy.maxRestartsWithoutProgress (1); "
                                "last: node 1 failed (exit code 1)")
