"""Warm spares, decided: the plan creates and keeps replicas + spareReplicas node pods; a node lost
to the node (deleted, evicted) is replaced at once and free, the replacement being the new spare; a
job-caused failure still backs off, so a crash loop cannot burn through the spares; the status
counts the spares waiting outside the round."""

from __future__ import annotations

from ddpjob_operator.api import constants as C
from ddpjob_operator.decide import spares
from ddpjob_operator.api.validation import parse_spec
from ddpjob_sandbox.jobs import make_ddpjob
from ddpjob_operator.decide.reconcile import reconcile
from tests.operator.builders import at, make_pod, observe, running_pods
from tests.operator.decide.test_plan import actions_at, created, deleted, requeues
from tests.operator.topology_builders import store


def spare_job(spares_wanted: int = 1, **fields) -> dict:
    return make_ddpjob(replicas=2, elasticPolicy={"spareReplicas": spares_wanted}, **fields)


def test_a_job_with_a_spare_creates_it_with_the_nodes_and_keeps_it():
    job = spare_job()
    actions = reconcile(job, observe([store(job)]), at(0)).actions  # the store pod exists: the nodes come
    assert created(actions) == ["mlp-node-0", "mlp-node-1", "mlp-node-2"]
    assert actions_at(job, running_pods(job, 3), 1) == []


def test_fewer_spares_delete_the_highest_index():
    job = spare_job(1)
    assert deleted(actions_at(job, running_pods(job, 4), 0)) == ["mlp-node-3"]


def test_a_node_deleted_with_its_node_is_replaced_at_once_as_the_new_spare_and_costs_nothing():
    """The spare (node 2) has taken node 1's place in the round; node 1 comes back at once,
    without a backoff, and waits as the spare."""
    job = spare_job()
    actions_at(job, running_pods(job, 3), 0)
    actions = actions_at(job, [make_pod(job, 0), make_pod(job, 2)], 30)
    assert (created(actions), requeues(actions)) == (["mlp-node-1"], [])
    assert job["status"].get("restarts", 0) == 0


def test_an_evicted_node_is_replaced_without_backoff_and_free():
    job = spare_job()
    actions_at(job, running_pods(job, 3), 0)
    actions_at(job, [make_pod(job, 0), make_pod(job, 1, phase="Failed", reason="Evicted"), make_pod(job, 2)], 30)
    assert created(actions_at(job, [make_pod(job, 0), make_pod(job, 2)], 31)) == ["mlp-node-1"]
    assert job["status"].get("restarts", 0) == 0


def test_a_job_caused_failure_in_a_row_backs_off_before_the_new_spare_so_a_crash_loop_cannot_burn_spares():
    """The spare joins the round by itself (torch's doing); the operator's part, creating the next
    spare, follows the failure policy of a failure the job's code caused: the incident is charged,
    the first is replaced at once and the next in a row waits the backoff, as without spares."""
    job = spare_job()  # backoff 10 s, from the second incident in a row
    actions_at(job, running_pods(job, 3), 0)
    first = actions_at(job, [make_pod(job, 0), make_pod(job, 1, phase="Failed", exit_code=1, finished_at=at(20)),
                             make_pod(job, 2)], 21)
    assert (deleted(first), created(first), job["status"]["restarts"]) == (["mlp-node-1"], [], 1)
    assert created(actions_at(job, [make_pod(job, 0), make_pod(job, 2)], 22)) == ["mlp-node-1"]
    again = actions_at(job, [make_pod(job, 0), make_pod(job, 1, phase="Failed", exit_code=1, finished_at=at(40),
                                                        uid="again", created_at=at(22)), make_pod(job, 2)], 41)
    assert (deleted(again), created(again), requeues(again)) == (["mlp-node-1"], [], [9.0])
    assert job["status"]["restarts"] == 2
    assert created(actions_at(job, [make_pod(job, 0), make_pod(job, 2)], 45)) == []
    assert created(actions_at(job, [make_pod(job, 0), make_pod(job, 2)], 50)) == ["mlp-node-1"]


def test_the_status_counts_the_spares_waiting_outside_the_round():
    job = spare_job()
    actions_at(job, running_pods(job, 3), 0)
    status = job["status"]
    assert (status["spares"], status["rendezvousReplicas"], status["ready"]) == (1, 2, "3/3")
    # the spare joined the round in the lost node's place; the new spare is still starting
    actions_at(job, [make_pod(job, 0), make_pod(job, 1, phase="Pending"), make_pod(job, 2)], 30)
    status = job["status"]
    assert (status["spares"], status["rendezvousReplicas"], status["ready"]) == (0, 2, "2/3")
    assert status["phase"] == C.PHASE_RUNNING


def test_a_job_without_spares_has_no_spare_count():
    job = make_ddpjob(replicas=2)
    actions_at(job, running_pods(job), 0)
    assert job["status"].get("spares") is None and job["status"]["rendezvousReplicas"] == 2


def test_spares_are_counted_only_beyond_max_replicas_and_up_to_spare_replicas():
    spec = parse_spec(spare_job(2)["spec"])
    assert [spares.waiting(spec, ready) for ready in range(6)] == [0, 0, 0, 1, 2, 2]
    assert [spares.in_round(spec, ready) for ready in range(6)] == [0, 1, 2, 2, 2, 2]
