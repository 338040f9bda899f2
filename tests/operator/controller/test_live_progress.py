"""Which node pods the progress poll asks, in which order (controller/live_progress.py).

The operator following a running job's progress on the real control plane:
tests/cluster/e2e/test_operator_live_progress.py; hostile endpoints: test_live_progress_hostile.py.
"""
import builtins

import pytest

from ddpjob_operator.controller.live_progress import progress_urls
from ddpjob_operator.decide.observed import view_pods
from ddpjob_sandbox.jobs import make_ddpjob
from tests.operator.builders import make_pod


def with_ip(pod, ip):
    pod["status"]["podIP"] = ip
    return pod


def test_the_running_node_pods_are_asked_lowest_index_first():
    job = make_ddpjob(replicas=4)
    pods = [with_ip(make_pod(job, 2), "10.0.0.2"), with_ip(make_pod(job, 0, phase="Pending"), "10.0.0.0"),
            with_ip(make_pod(job, 1), "fd00::1"), make_pod(job, 3),  # no IP yet
            with_ip(make_pod(job, 4, deleting=True), "10.0.0.4")]
    assert progress_urls(view_pods(pods)) == ["http://[fd00::1]:29410/progress", "http://10.0.0.2:29410/progress"]


def test_a_pod_without_the_progress_port_is_not_asked():
    job = make_ddpjob(replicas=1)
    pod = with_ip(make_pod(job, 0), "10.0.0.1")
    pod["spec"]["containers"][0]["ports"] = []  # rendered by an operator from before the endpoint
    assert progress_urls(view_pods([pod])) == []


def test_the_progress_poll_reads_the_pod_order_and_sorts_nothing(monkeypatch):
    """Lowest index first comes from the observation's pod order (decide/observed.py), taken once."""
    job = make_ddpjob(replicas=3)
    pods = view_pods([with_ip(make_pod(job, i), f"10.0.0.{i}") for i in (2, 0, 1)])
    monkeypatch.setattr(builtins, "sorted", lambda *_, **__: pytest.fail("the progress poll sorted the pods again"))
    assert progress_urls(pods) == [f"http://10.0.0.{i}:29410/progress" for i in (0, 1, 2)]
