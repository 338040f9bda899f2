"""Pods are sorted once, where a pass's snapshot is taken (decide/observed.py): the observation
holds them in pod order, refuses any other, is grouped by generation once per generation,
and no consumer sorts them again."""

from __future__ import annotations

import builtins
import random

import pytest

from ddpjob_operator.decide.actions import DeletePod
from ddpjob_operator.decide.observed import NodeGroups, Observed, PodView, view_pod, view_pods
from ddpjob_operator.decide.reconcile import reconcile
from ddpjob_sandbox.jobs import make_ddpjob
from tests.operator.builders import at, make_pod, observe, running_pods
from tests.operator.decide import test_hang
from tests.operator.topology_builders import gen_pod, store, with_store


@pytest.fixture
def counted(monkeypatch):
    """Counts NodeGroups.sort calls and sorted() calls over PodViews, from when it is asked for."""
    counts = {"groupings": 0, "pod sorts": 0}
    group, real_sorted = NodeGroups.sort.__func__, builtins.sorted

    def grouping(cls, *args, **kwargs):
        counts["groupings"] += 1
        return group(cls, *args, **kwargs)

    def sorting(items, *args, **kwargs):
        items = list(items)
        counts["pod sorts"] += any(isinstance(i, PodView) for i in items)
        return real_sorted(items, *args, **kwargs)

    monkeypatch.setattr(NodeGroups, "sort", classmethod(grouping))
    monkeypatch.setattr(builtins, "sorted", sorting)
    return counts


def test_taking_the_snapshot_is_the_one_sort(counted):
    job = make_ddpjob(replicas=3)
    observe(running_pods(job))
    assert counted["pod sorts"] == 1


def test_an_observation_holds_its_pods_in_pod_order_whatever_order_they_are_listed_in():
    job = make_ddpjob(replicas=12)
    pods = [make_pod(job, i) for i in (10, 2, 0, 11, 1)] + [store(job), gen_pod(job, 3, 1), gen_pod(job, 3, 0)]
    random.Random(7).shuffle(pods)
    assert [(p.name, p.generation) for p in observe(pods).pods] == [
        ("mlp-node-0", 0), ("mlp-node-1", 0), ("mlp-node-2", 0), ("mlp-node-3", 0), ("mlp-node-3", 1),
        ("mlp-node-10", 0), ("mlp-node-11", 0), ("mlp-rdzv", 0)]


def test_an_observation_refuses_pods_out_of_pod_order():
    job = make_ddpjob(replicas=2)
    with pytest.raises(ValueError, match=r"Observed.pods must be in pod order .*: got mlp-node-1, mlp-node-0"):
        Observed(pods=(view_pod(make_pod(job, 1)), view_pod(make_pod(job, 0))))
    assert Observed(pods=view_pods([make_pod(job, 1), make_pod(job, 0)])).pods[0].name == "mlp-node-0"


def test_a_pass_groups_its_pods_once_and_sorts_them_never(counted):
    job = make_ddpjob(replicas=3)
    job["status"] = {"phase": "Running"}
    observed = observe(with_store(job, running_pods(job)))
    counted.update({"groupings": 0, "pod sorts": 0})  # the observation's own sort is not the pass's
    result = reconcile(job, observed, at(5))
    assert result.status["phase"] == "Running"
    assert counted == {"groupings": 1, "pod sorts": 0}


def test_scaling_in_deletes_the_highest_index_first_reading_the_pod_order_backwards(counted):
    job = make_ddpjob(replicas=2, min_replicas=1, max_replicas=12)
    job["status"] = {"phase": "Running"}
    observed = observe(with_store(job, [make_pod(job, i) for i in (0, 1, 2, 3, 10)]))
    counted.update({"groupings": 0, "pod sorts": 0})
    deleted = [a.name for a in reconcile(job, observed, at(5)).actions if isinstance(a, DeletePod)]
    assert deleted == ["mlp-node-10", "mlp-node-3", "mlp-node-2"]
    assert counted == {"groupings": 1, "pod sorts": 0}


def test_a_hang_restart_groups_the_pods_once_for_each_generation(counted):
    body = test_hang.job(hangTimeoutSeconds=60)
    test_hang.step(body, 0, [test_hang.record(40)])
    test_hang.step(body, 59, [test_hang.record(40)])
    observed = observe(test_hang.running(body),
                       live_progress=[test_hang.record(40, phases=("collective", "local", "collective"))])
    counted.update({"groupings": 0, "pod sorts": 0})
    result = reconcile(body, observed, at(61))
    assert result.status["rendezvousGeneration"] == 1
    assert counted == {"groupings": 2, "pod sorts": 0}  # generation 0, then generation 1
