"""KubeClient keeps one connection per thread (ddpjob_sandbox.client): what it reuses, when it opens a
new one, and that a request is sent twice only where the first never reached a server."""
import http.server
import json
import socketserver
import threading

import pytest

from ddpjob_sandbox import client as client_module
from ddpjob_sandbox.client import ApiError, KubeClient


class Server(socketserver.ThreadingTCPServer):
    """An HTTP/1.1 server on loopback that counts connections and requests. ``mode``: "keep" answers
    and keeps the connection; "answer-then-close" answers (saying keep-alive) and closes it, as a
    server that stops between two requests; "close-unanswered" closes on reading a request."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), Handler)
        self.connections, self.requests, self.mode = 0, [], "keep"
        self.lock = threading.Lock()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Server

    def setup(self):
        super().setup()
        with self.server.lock:
            self.server.connections += 1

    def _answer(self, status: int, body: dict) -> None:
        with self.server.lock:
            self.server.requests.append((self.command, self.path))
            mode = self.server.mode  # read once: the test may change it as soon as it has the answer
        if mode == "close-unanswered":
            self.close_connection = True
            return
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        if mode == "answer-then-close":
            self.close_connection = True

    def do_GET(self):
        if self.path.endswith("/missing"):
            self._answer(404, {"kind": "Status", "reason": "NotFound", "message": "pods \"missing\" not found"})
        else:
            self._answer(200, {"items": [], "path": self.path})

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._answer(201, {"created": True})

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    with Server() as server:
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        thread.start()
        yield server
        server.shutdown()


@pytest.fixture
def client(server, tmp_path):
    return KubeClient(f"http://127.0.0.1:{server.server_address[1]}", tmp_path / "kubeconfig")


def test_the_requests_of_one_thread_share_one_connection_and_each_thread_has_its_own(server, client):
    for _ in range(5):
        assert client.list("pods") == []
    assert server.connections == 1
    other = threading.Thread(target=client.list, args=("pods",))
    other.start()
    other.join(10)
    assert (server.connections, len(server.requests)) == (2, 6)


def test_an_api_error_keeps_its_status_and_body_and_the_connection(server, client):
    with pytest.raises(ApiError) as error:
        client.get("pods", "missing")
    assert error.value.status == 404 and error.value.body["reason"] == "NotFound"
    assert client.list("pods") == []
    assert server.connections == 1


def test_a_kept_connection_the_server_closed_is_retried_once_on_a_new_one(server, client):
    server.mode = "answer-then-close"  # the server goes away between two requests, unannounced
    assert client.list("pods") == []
    server.mode = "keep"
    assert client.create("pods", {"metadata": {"name": "p"}}) == {"created": True}
    assert [method for method, _ in server.requests] == ["GET", "POST"], "the POST reached the server once"
    assert server.connections == 2


def test_a_new_connection_closed_unanswered_raises_and_the_request_is_not_sent_again(server, client):
    server.mode = "close-unanswered"
    with pytest.raises(ConnectionError):
        client.create("pods", {"metadata": {"name": "p"}})
    assert [method for method, _ in server.requests] == ["POST"], "sent once: it may have been acted on"


def test_a_kept_connection_closed_unanswered_is_retried_once_then_raises(server, client):
    client.list("pods")
    server.mode = "close-unanswered"
    with pytest.raises(ConnectionError):
        client.list("pods")
    assert len(server.requests) == 3, "the first request, then the GET on the kept and on a new connection"


def test_a_connection_idle_past_the_bound_is_replaced_before_the_next_request(server, client, monkeypatch):
    client.list("pods")
    monkeypatch.setattr(client_module, "IDLE_SECONDS", 0.0)
    client.list("pods")
    assert server.connections == 2
