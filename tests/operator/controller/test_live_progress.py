"""A running job's progress, read from its node pods' progress endpoints.

Without it the operator learns where training stands only when a container exits; these
prove that the status follows a job that never fails, from one node that answers.
"""
import http.server
import random
import threading

import pytest

from ddpjob_operator.api import constants as C
from ddpjob_operator.controller.live_progress import progress_urls
from ddpjob_sandbox.jobs import make_ddpjob, make_manifest
from tests.operator.builders import make_pod
from ddpjob_sandbox.readers import pod_names, status
from ddpjob_sandbox.pod_status import progress_message
from ddpjob_sandbox.scripted import set_running
from ddpjob_sandbox.operator_process import OperatorProcess, operator_command


def with_ip(pod, ip):
    pod["status"]["podIP"] = ip
    return pod


def test_the_running_node_pods_are_asked_lowest_index_first():
    job = make_ddpjob(replicas=4)
    pods = [with_ip(make_pod(job, 2), "10.0.0.2"), with_ip(make_pod(job, 0, phase="Pending"), "10.0.0.0"),
            with_ip(make_pod(job, 1), "fd00::1"), make_pod(job, 3),  # no IP yet
            with_ip(make_pod(job, 4, deleting=True), "10.0.0.4")]
    assert progress_urls(pods) == ["http://[fd00::1]:29410/progress", "http://10.0.0.2:29410/progress"]


def test_a_pod_without_the_progress_port_is_not_asked():
    job = make_ddpjob(replicas=1)
    pod = with_ip(make_pod(job, 0), "10.0.0.1")
    pod["spec"]["containers"][0]["ports"] = []  # rendered by an operator from before the endpoint
    assert progress_urls([pod]) == []


class FakeNode:
    """A node's progress endpoint on its own loopback address, as a pod IP."""

    def __init__(self):
        self.ip = f"127.{random.randint(1, 254)}.{random.randint(1, 254)}.{random.randint(1, 254)}"
        self.body = b""
        node = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = node.body if self.path == "/progress" else b""
                self.send_response(200 if body else 404)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer((self.ip, C.PROGRESS_PORT), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def at_step(self, step, time):
        self.body = progress_message(step, snapshot_time=time).encode()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake_node():
    node = FakeNode()
    yield node
    node.close()


def test_a_running_job_that_never_fails_shows_each_new_snapshot(cluster, k8s, tmp_path, fake_node):
    command = operator_command(k8s.namespace, "--progress-poll-seconds", "0.5")
    with OperatorProcess(cluster, command, tmp_path / "operator.log") as process:
        k8s.create("ddpjobs", make_manifest(replicas=1))
        k8s.wait_for(lambda: pod_names(k8s) == ["mlp-node-0"], what="the node pod")
        fake_node.at_step(40, "2026-11-23T01:00:40Z")
        set_running(k8s, "mlp-node-0")
        k8s.patch("pods", "mlp-node-0", {"status": {"podIP": fake_node.ip}}, subresource="status")
        k8s.wait_for(lambda: (status(k8s).get("lastSnapshot") or {}).get("step") == 40, timeout=20,
                     what="lastSnapshot from the endpoint")
        fake_node.at_step(80, "2026-11-23T01:01:20Z")  # no pod event: only the poll can see this
        k8s.wait_for(lambda: (status(k8s).get("lastSnapshot") or {}).get("step") == 80, timeout=20,
                     what="the next snapshot, polled")
        assert status(k8s)["lastSnapshot"]["time"] == "2026-11-23T01:01:20Z"
    assert "Traceback" not in process.log()
