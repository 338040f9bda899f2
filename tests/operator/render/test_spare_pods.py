"""Warm spares, rendered: spec.elasticPolicy.spareReplicas adds node pods after the replicas, from the
same template; the Kueue pod group counts them, the disruption budget does not protect them, and
their /dev/shm is the nodes' (a limit, not a reservation)."""

from __future__ import annotations

import copy

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.validation import parse_spec
from ddpjob_operator.render import objects
from ddpjob_operator.render.kueue import kueue_metadata
from ddpjob_operator.render.node_pod import render_pod
from ddpjob_operator.render.pdb import min_available
from ddpjob_sandbox.jobs import make_ddpjob
from tests.operator.builders import job_ref


def spare_job(spares: int = 1, **fields) -> dict:
    return make_ddpjob(replicas=2, elasticPolicy={"spareReplicas": spares}, **fields)


def node_names(job: dict) -> list[str]:
    wanted = objects.wanted_objects(job_ref(job), parse_spec(job["spec"]))
    return [w.name for w in objects.of_role(wanted, objects.NODE)]


def test_spares_continue_the_node_indexes_after_the_replicas():
    assert node_names(spare_job(2)) == ["mlp-node-0", "mlp-node-1", "mlp-node-2", "mlp-node-3"]
    assert node_names(spare_job(0)) == ["mlp-node-0", "mlp-node-1"]


def without_index(pod: dict) -> dict:
    """A node pod with what names its index taken out."""
    pod = copy.deepcopy(pod)
    meta, spec = pod["metadata"], pod["spec"]
    del meta["name"], meta["labels"][C.LABEL_NODE_INDEX], spec["hostname"]
    spec["containers"][0]["env"] = [e for e in spec["containers"][0]["env"]
                                    if e["name"] not in (C.ENV_NODE_INDEX, C.ENV_POD_NAME)]
    return pod


def test_a_spare_is_the_same_pod_as_a_node_the_same_torchrun_range_and_shm_included():
    """Which pod waits is the rendezvous' choice (the first max_nodes to join train), so a spare
    must be able to take any node's place: same command, --nnodes, resources and /dev/shm."""
    job = spare_job(1, resources={"limits": {"memory": "4Gi"}})
    ref, spec = job_ref(job), parse_spec(job["spec"])
    node, spare = render_pod(ref, spec, 1), render_pod(ref, spec, 2)
    assert without_index(spare) == without_index(node)
    env = {e["name"]: e.get("value") for e in spare["spec"]["containers"][0]["env"]}
    assert env["PET_NNODES"] == "2:2"  # the group's range: beyond it, torch parks the agent as redundant
    shm = next(v for v in spare["spec"]["volumes"] if v["name"] == C.SHM_VOLUME)
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "2Gi"}  # half the limit, as for any node


def test_the_kueue_pod_group_counts_the_spares():
    job = spare_job(1, scheduling={"queueName": "team-a"})
    _, annotations = kueue_metadata(job_ref(job), parse_spec(job["spec"]))
    assert annotations[C.ANNOTATION_KUEUE_GROUP_COUNT] == "3"


def test_the_disruption_budget_keeps_the_groups_minimum_and_leaves_spares_unprotected():
    """minAvailable is what the group alone needs; with a spare Ready one more pod may be evicted."""
    plain, spared = parse_spec(make_ddpjob(replicas=2)["spec"]), parse_spec(spare_job(1)["spec"])
    assert min_available(spared) == min_available(plain) == 2  # one node + the store pod
    # Ready: store + 2 nodes (+ the spare): the budget allows 1 eviction without, 2 with the spare.
    assert 4 - min_available(spared, healthy=4) == 2 and 3 - min_available(plain, healthy=3) == 1
