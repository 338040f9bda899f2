"""A running job's progress, read from its node pods' progress endpoints.

Without it the operator learns where training stands only when a container exits; these
prove that the status follows a job that never fails, from one node that answers, and that
a malformed record, there or in a termination message, cannot stop a pass (the real
operator over the API emulator; hostile endpoints: test_live_progress_hostile.py).
"""
import builtins
import json

import pytest

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.clock import parse_time
from ddpjob_operator.controller.live_progress import progress_urls
from ddpjob_operator.decide.observed import view_pods
from ddpjob_sandbox.jobs import make_ddpjob
from tests.operator.builders import make_pod
from tests.support.fake_pods import FakePod, record_answer
from ddpjob_sandbox.jobs import make_manifest
from ddpjob_sandbox.readers import events, pod_names, status
from ddpjob_sandbox.pod_status import progress_message
from ddpjob_sandbox.scripted import set_running, set_terminated
from ddpjob_sandbox.operator_process import OperatorProcess, operator_command


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


def point_at(k8s, name, fake):
    """The pod's IP and progress port become the fake pod's. The port changes too: a trainer
    elsewhere on this machine listening on 0.0.0.0:29410 takes that port from every loopback
    address (the emulator, unlike an API server, lets a test change a pod's ports)."""
    containers = k8s.get("pods", name)["spec"]["containers"]
    for port in containers[0]["ports"]:
        if port["name"] == C.PROGRESS_PORT_NAME:
            port["containerPort"] = fake.port
    k8s.patch("pods", name, {"spec": {"containers": containers}})
    k8s.patch("pods", name, {"status": {"podIP": fake.ip}}, subresource="status")


def at_step(step, time):
    return record_answer(progress_message(step, snapshot_time=time))


def test_a_running_job_that_never_fails_shows_each_new_snapshot(cluster, k8s, tmp_path):
    # A new snapshot is routine progress: written within one --status-write-interval-seconds.
    command = operator_command(k8s.namespace, "--progress-poll-seconds", "0.5", "--status-write-interval-seconds", "2")
    with FakePod(at_step(40, "2026-11-23T01:00:40Z")) as fake, \
            OperatorProcess(cluster, command, tmp_path / "operator.log") as process:
        k8s.create("ddpjobs", make_manifest(replicas=1))
        k8s.wait_for(lambda: pod_names(k8s) == ["mlp-node-0"], what="the node pod")
        set_running(k8s, "mlp-node-0")
        point_at(k8s, "mlp-node-0", fake)
        k8s.wait_for(lambda: (status(k8s).get("lastSnapshot") or {}).get("step") == 40, timeout=20,
                     what="lastSnapshot from the endpoint")
        fake.answer = at_step(80, "2026-11-23T01:01:20Z")  # no pod event: only the poll can see this
        k8s.wait_for(lambda: (status(k8s).get("lastSnapshot") or {}).get("step") == 80, timeout=20,
                     what="the next snapshot, polled")
        assert status(k8s)["lastSnapshot"]["time"] == "2026-11-23T01:01:20Z"
    assert "Traceback" not in process.log()


def invalid_record_events(k8s):
    return [message for kind, reason, message in events(k8s)
            if (kind, reason) == (C.EVENT_WARNING, C.REASON_INVALID_PROGRESS_RECORD)]


def test_malformed_records_at_the_endpoint_and_in_a_termination_message_cannot_stop_a_pass(cluster, k8s, tmp_path):
    """Before the contract, either record made every pass raise: no status, no replacement."""
    record = json.loads(progress_message(40))
    bad_step = json.dumps({**record, "snapshot": {**record["snapshot"], "step": "40a"}})
    bad_time = json.dumps({**record, "resume": {**record["resume"], "time": "yesterday"}})
    command = operator_command(k8s.namespace, "--progress-poll-seconds", "0.3")
    with FakePod(record_answer(bad_step)) as fake, \
            OperatorProcess(cluster, command, tmp_path / "operator.log") as process:
        k8s.create("ddpjobs", make_manifest(replicas=1))
        k8s.wait_for(lambda: pod_names(k8s) == ["mlp-node-0"], what="the node pod")
        first_uid = k8s.get("pods", "mlp-node-0")["metadata"]["uid"]
        set_running(k8s, "mlp-node-0")
        point_at(k8s, "mlp-node-0", fake)
        k8s.wait_for(lambda: invalid_record_events(k8s), timeout=20, what="the Warning about the endpoint's record")
        k8s.wait_for(lambda: status(k8s).get("phase") == C.PHASE_RUNNING, what="the pass writing the status")
        polls = len(fake.exchanges)
        k8s.wait_for(lambda: len(fake.exchanges) >= polls + 3, timeout=20, what="three more polls")
        assert invalid_record_events(k8s) == [
            'node pod mlp-node-0: ignored the progress record in its progress endpoint: snapshot.step ("40a") '
            "must be an integer from 0 to 9007199254740991"], "reported once, not every poll"
        [listed] = status(k8s)["invalidProgressRecords"]
        assert listed == {"pod": "mlp-node-0", "podUID": first_uid, "field": "snapshot.step", "time": listed["time"]}
        assert parse_time(listed["time"]) is not None, "when it was reported: the endpoint's one a minute"

        set_terminated(k8s, "mlp-node-0", 1, message=bad_time)
        k8s.wait_for(lambda: len(invalid_record_events(k8s)) == 2, timeout=20,
                     what="the Warning about the termination message")
        assert invalid_record_events(k8s)[1] == (
            'node pod mlp-node-0: ignored the progress record in its termination message: resume.time ("yesterday") '
            "must be an RFC 3339 time such as 2026-01-02T03:04:05Z")
        k8s.wait_for(lambda: status(k8s).get("restarts") == 1, timeout=20, what="the failure counted")
        k8s.wait_for(lambda: (k8s.find("pods", "mlp-node-0") or {}).get("metadata", {}).get("uid")
                     not in (None, first_uid), timeout=20, what="a replacement pod")
    assert "Traceback" not in process.log()


def test_the_progress_poll_reads_the_pod_order_and_sorts_nothing(monkeypatch):
    """Lowest index first comes from the observation's pod order (decide/observed.py), taken once."""
    job = make_ddpjob(replicas=3)
    pods = view_pods([with_ip(make_pod(job, i), f"10.0.0.{i}") for i in (2, 0, 1)])
    monkeypatch.setattr(builtins, "sorted", lambda *_, **__: pytest.fail("the progress poll sorted the pods again"))
    assert progress_urls(pods) == [f"http://10.0.0.{i}:29410/progress" for i in (0, 1, 2)]
