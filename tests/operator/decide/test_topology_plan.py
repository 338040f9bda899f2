"""Rendezvous topology, pure: which lost pod restarts the whole group under a new rendezvous
generation (c10d store host, store pod) and which is replaced alone (etcd, other nodes)."""

from __future__ import annotations

import pytest

from ddpjob_operator.api import constants as C
from ddpjob_operator.decide.actions import CreatePod, CreateService, DeletePod, Requeue
from ddpjob_operator.decide.reconcile import reconcile
from tests.operator.builders import at, make_pod, observe
from ddpjob_sandbox.jobs import make_ddpjob
from tests.operator.topology_builders import ETCD_V3, STORE_ON_NODE, STORE_POD, env_of, gen_pod, step, store


def created(result) -> list[str]:
    return [a.body["metadata"]["name"] for a in result.actions if isinstance(a, CreatePod)]


def created_pods(result) -> list[dict]:
    return [a.body for a in result.actions if isinstance(a, CreatePod)]


def deleted(result) -> list[str]:
    return sorted(a.name for a in result.actions if isinstance(a, DeletePod))


def reasons(result) -> list[str]:
    return [e.reason for e in result.events]


def running(job: dict, generation: int = 0, count: int = 3) -> list[dict]:
    return [gen_pod(job, i, generation) for i in range(count)]


# --- c10d, store on node 0 ------------------------------------------------------------

def test_losing_the_store_host_restarts_the_whole_group_as_one_incident_under_a_new_generation():
    job = make_ddpjob(replicas=3, **STORE_ON_NODE)
    step(job, running(job), 0)
    pods = [gen_pod(job, 0, 0, phase="Failed", exit_code=1), gen_pod(job, 1, 0), gen_pod(job, 2, 0)]
    result = step(job, pods, 10)
    assert (result.status["rendezvousGeneration"], result.status["restarts"]) == (1, 1)
    assert (result.status["phase"], reasons(result)) == ("Restarting", [C.REASON_GROUP_RESTART])
    assert result.events[0].message == (
        "node pod mlp-node-0 (the c10d store host) failed (exit code 1): restarting all node pods together "
        "under rendezvous generation 1 from the last snapshot; one failure incident, charged to "
        "spec.failurePolicy.maxRestarts (5) unless a newer snapshot was complete")
    assert deleted(result) == ["mlp-node-0", "mlp-node-1", "mlp-node-2"]  # the survivors too, at once
    assert created(result) == []


def test_agents_that_die_with_the_store_add_no_incident_and_no_event():
    job = make_ddpjob(replicas=3, **STORE_ON_NODE)
    step(job, running(job), 0)
    step(job, [gen_pod(job, 0, 0, phase="Failed"), gen_pod(job, 1, 0), gen_pod(job, 2, 0)], 10)
    cascade = [gen_pod(job, i, 0, phase="Failed", exit_code=1) for i in range(3)]
    result = step(job, cascade, 11)
    assert (result.status["restarts"], result.status["rendezvousGeneration"]) == (1, 1)
    assert result.events == []


def test_the_new_group_is_created_together_with_a_new_rendezvous_id_and_again_after_the_backoff():
    job = make_ddpjob(replicas=3, **STORE_ON_NODE)  # default failurePolicy: backoff 10 s from the 2nd in a row
    step(job, running(job), 0)
    step(job, [gen_pod(job, 0, 0, phase="Failed", finished_at=at(10)), gen_pod(job, 1, 0), gen_pod(job, 2, 0)], 10)
    result = step(job, [], 12)  # the old group is gone: the first incident is replaced at once
    assert created(result) == ["mlp-node-0", "mlp-node-1", "mlp-node-2"]
    for pod in created_pods(result):
        assert pod["metadata"]["labels"][C.LABEL_RDZV_GENERATION] == "1"
        assert env_of(pod)["PET_RDZV_ID"] == "uid-mlp-1"
    step(job, [gen_pod(job, 0, 1, phase="Failed", finished_at=at(20), created_at=at(12)),
               gen_pod(job, 1, 1, created_at=at(12)), gen_pod(job, 2, 1, created_at=at(12))], 20)
    assert created(step(job, [], 22)) == []  # the store host failed again at once: the backoff
    result = step(job, [], 30)
    assert created(result) == ["mlp-node-0", "mlp-node-1", "mlp-node-2"]
    assert {env_of(pod)["PET_RDZV_ID"] for pod in created_pods(result)} == {"uid-mlp-2"}


def test_no_pod_of_the_new_generation_is_created_while_one_of_the_old_is_still_there():
    job = make_ddpjob(replicas=3, **STORE_ON_NODE)
    step(job, running(job), 0)
    step(job, [gen_pod(job, 0, 0, phase="Failed"), gen_pod(job, 1, 0), gen_pod(job, 2, 0)], 10)
    result = step(job, [gen_pod(job, 2, 0, deleting=True)], 60)  # node-0 and node-1 are free names
    assert created(result) == []
    assert [a.after for a in result.actions if isinstance(a, Requeue)] == [2.0]


def test_a_pod_of_an_older_generation_is_deleted_even_without_a_label():
    job = make_ddpjob(replicas=2, status={"rendezvousGeneration": 2}, **STORE_ON_NODE)
    unlabelled = make_pod(job, 1)
    del unlabelled["metadata"]["labels"][C.LABEL_RDZV_GENERATION]  # made by an older operator
    result = step(job, [gen_pod(job, 0, 2), unlabelled], 0)
    assert deleted(result) == ["mlp-node-1"]
    assert result.status["runningReplicas"] == 1  # the stale pod does not count


def test_a_deleted_store_host_under_a_running_group_restarts_it_without_using_the_budget():
    job = make_ddpjob(replicas=3, **STORE_ON_NODE)
    step(job, running(job), 0)
    result = step(job, [gen_pod(job, 1, 0), gen_pod(job, 2, 0)], 10)
    assert (result.status["rendezvousGeneration"], result.status.get("restarts", 0)) == (1, 0)
    assert "node pod mlp-node-0 (the c10d store host) was deleted" in result.events[0].message
    assert "does not use the restart budget" in result.events[0].message
    assert deleted(result) == ["mlp-node-1", "mlp-node-2"]


def test_a_missing_store_host_while_the_others_still_start_is_simply_created():
    job = make_ddpjob(replicas=3, **STORE_ON_NODE)
    result = step(job, [gen_pod(job, 1, 0, phase="Pending"), gen_pod(job, 2, 0, phase="Pending")], 0)
    assert result.status.get("rendezvousGeneration") is None
    assert created(result) == ["mlp-node-0"]


def test_losing_another_node_replaces_only_that_node_under_the_same_id():
    job = make_ddpjob(replicas=3, **STORE_ON_NODE)
    step(job, running(job), 0)
    result = step(job, [gen_pod(job, 0, 0), gen_pod(job, 1, 0, phase="Failed"), gen_pod(job, 2, 0)], 10)
    assert result.status.get("rendezvousGeneration") is None
    assert deleted(result) == ["mlp-node-1"]
    replacement = created_pods(step(job, [gen_pod(job, 0, 0), gen_pod(job, 2, 0)], 30))
    assert [(p["metadata"]["name"], env_of(p)["PET_RDZV_ID"]) for p in replacement] == [("mlp-node-1", "uid-mlp")]


def test_a_single_node_job_replaces_its_node_without_a_group_restart():
    job = make_ddpjob(replicas=1, **STORE_ON_NODE)
    step(job, running(job, count=1), 0)
    result = step(job, [gen_pod(job, 0, 0, phase="Failed")], 10)
    assert result.status.get("rendezvousGeneration") is None
    assert reasons(result) == [C.REASON_NODE_FAILED, C.REASON_NODE_FAILED]


def test_a_store_host_failing_with_a_permanent_exit_code_fails_the_job():
    job = make_ddpjob(replicas=3, **STORE_ON_NODE)
    step(job, running(job), 0)
    result = step(job, [gen_pod(job, 0, 0, phase="Failed", exit_code=127), gen_pod(job, 1, 0),
                        gen_pod(job, 2, 0)], 10)
    assert (result.status["phase"], result.status.get("rendezvousGeneration")) == ("Failed", None)


def test_a_group_restart_beyond_the_budget_fails_the_job():
    job = make_ddpjob(replicas=2, failurePolicy={"maxRestarts": 0}, **STORE_ON_NODE)
    step(job, running(job, count=2), 0)
    result = step(job, [gen_pod(job, 0, 0, phase="Failed"), gen_pod(job, 1, 0)], 10)
    assert result.status["phase"] == "Failed"
    assert C.REASON_GROUP_RESTART in reasons(result)


def test_a_second_group_restart_is_a_second_incident_with_the_next_generation():
    job = make_ddpjob(replicas=2, **STORE_ON_NODE)
    step(job, running(job, count=2), 0)
    step(job, [gen_pod(job, 0, 0, phase="Failed"), gen_pod(job, 1, 0)], 10)
    step(job, running(job, 1, count=2), 100)
    result = step(job, [gen_pod(job, 0, 1, phase="Failed", finished_at=at(200)), gen_pod(job, 1, 1)], 200)
    assert (result.status["rendezvousGeneration"], result.status["restarts"]) == (2, 2)
    assert deleted(result) == ["mlp-node-0", "mlp-node-1"]


# --- etcd -----------------------------------------------------------------------------

@pytest.mark.parametrize("index", [0, 1])
def test_under_etcd_a_lost_node_is_replaced_alone_under_the_same_id(index):
    job = make_ddpjob(replicas=3, **ETCD_V3)
    step(job, running(job), 0)
    pods = [gen_pod(job, i, 0, phase="Failed" if i == index else "Running") for i in range(3)]
    result = step(job, pods, 10)
    assert (result.status.get("rendezvousGeneration"), deleted(result)) == (None, [f"mlp-node-{index}"])
    survivors = [p for p in pods if p["status"]["phase"] == "Running"]
    replacement = created_pods(step(job, survivors, 30))
    assert [env_of(p)["PET_RDZV_ID"] for p in replacement] == ["uid-mlp"]


# --- c10d with a store pod -------------------------------------------------------------

def test_a_store_pod_job_creates_the_store_and_its_service_before_any_node():
    job = make_ddpjob(replicas=2, **STORE_POD)
    result = step(job, [], 0, service_exists=False)
    services = [a.body["metadata"]["name"] for a in result.actions if isinstance(a, CreateService)]
    assert (services, created(result)) == (["mlp", "mlp-rdzv"], ["mlp-rdzv"])
    nodes = created_pods(step(job, [store(job, "Pending")], 1))
    assert [p["metadata"]["name"] for p in nodes] == ["mlp-node-0", "mlp-node-1"]
    env = env_of(nodes[0])
    assert env["PET_RDZV_ENDPOINT"] == "mlp-rdzv.default.svc.cluster.local:29400"
    assert env["PET_RDZV_CONF"].endswith(",is_host=false")


def test_a_store_pod_left_without_its_service_by_a_cut_short_pass_gets_the_service_and_keeps_the_pod():
    # The store pod and its Service are created in one wave: an operator killed between the two
    # leaves the pod alone, and the next operator's pass must still create the Service.
    job = make_ddpjob(replicas=2, **STORE_POD)
    result = reconcile(job, observe([store(job, "Pending")], store_service_exists=False), at(1))
    services = [a.body["metadata"]["name"] for a in result.actions if isinstance(a, CreateService)]
    assert (services, created(result), deleted(result)) == (["mlp-rdzv"], ["mlp-node-0", "mlp-node-1"], [])


def test_with_a_store_pod_losing_node_0_replaces_only_node_0():
    job = make_ddpjob(replicas=3, **STORE_POD)
    step(job, [store(job)] + running(job), 0)
    result = step(job, [store(job), gen_pod(job, 0, 0, phase="Failed"), gen_pod(job, 1, 0), gen_pod(job, 2, 0)], 10)
    assert (result.status.get("rendezvousGeneration"), deleted(result)) == (None, ["mlp-node-0"])
    assert result.status["restarts"] == 1


def test_a_failed_store_pod_is_replaced_and_the_group_restarts_under_a_new_generation():
    job = make_ddpjob(replicas=2, **STORE_POD)
    step(job, [store(job)] + running(job, count=2), 0)
    result = step(job, [store(job, "Failed")] + running(job, count=2), 10)
    assert (result.status["rendezvousGeneration"], result.status["restarts"]) == (1, 1)
    assert "rendezvous store pod mlp-rdzv failed (exit code 1)" in result.events[0].message
    assert deleted(result) == ["mlp-node-0", "mlp-node-1", "mlp-rdzv"]
    again = step(job, [], 11)  # everything is gone: the store comes first, nodes wait for it
    assert created(again) == ["mlp-rdzv"]
    nodes = created_pods(step(job, [store(job, "Running", uid="store-2")], 30))
    assert [env_of(p)["PET_RDZV_ID"] for p in nodes] == ["uid-mlp-1", "uid-mlp-1"]


def test_a_failed_store_pod_is_counted_once_while_it_is_being_replaced():
    job = make_ddpjob(replicas=2, **STORE_POD)
    step(job, [store(job)] + running(job, count=2), 0)
    step(job, [store(job, "Failed")] + running(job, count=2), 10)
    result = step(job, [store(job, "Failed")], 12)
    assert (result.status["rendezvousGeneration"], result.status["restarts"], result.events) == (1, 1, [])


def test_a_deleted_store_pod_under_running_nodes_restarts_the_group():
    job = make_ddpjob(replicas=2, **STORE_POD)
    step(job, [store(job)] + running(job, count=2), 0)
    result = step(job, [store(job, deleting=True)] + running(job, count=2), 10)
    assert result.status["rendezvousGeneration"] == 1
    assert deleted(result) == ["mlp-node-0", "mlp-node-1"]
    assert created(result) == []  # not while the old store terminates


def test_scaling_down_never_deletes_the_store_pod():
    job = make_ddpjob(replicas=1, max_replicas=3, **STORE_POD)
    result = step(job, [store(job)] + running(job, count=3), 0)
    assert deleted(result) == ["mlp-node-1", "mlp-node-2"]


def test_a_finished_job_deletes_its_store_pod_whatever_the_clean_pod_policy():
    job = make_ddpjob(replicas=1, runPolicy={"cleanPodPolicy": "None"}, **STORE_POD)
    step(job, [store(job), gen_pod(job, 0, 0)], 0)
    result = step(job, [store(job), gen_pod(job, 0, 0, phase="Succeeded")], 10)
    assert result.status["phase"] == "Succeeded"
    assert deleted(result) == ["mlp-rdzv"]


def test_the_store_pod_does_not_count_as_a_node():
    job = make_ddpjob(replicas=2, **STORE_POD)
    status = step(job, [store(job)] + running(job, count=2), 0).status
    assert (status["replicas"], status["readyReplicas"], status["runningReplicas"]) == (2, 2, 2)
