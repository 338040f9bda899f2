"""A node hears at once that a peer's agent died, from the peer's liveness beacon closing
(ddpjob_trainer.rendezvous.watch), and never takes a peer that stops on purpose, a slow or
hostile listener, or a full beacon for a lost one."""
import contextlib
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from ddpjob_trainer.rendezvous import liveness
from ddpjob_trainer.rendezvous.liveness import FULL, Beacon, probe
from ddpjob_trainer.rendezvous.watch import BeaconWatch, Peer

TOKEN = "a" * 32
WAIT = 10.0  # bound for what should take milliseconds: a missed notice fails, a slow machine does not

# A peer's beacon as the kernel sees it: answers the token, holds every connection. Plain Python
# (no torch), so it starts at once; SIGKILLing it is what an OOM kill does to an agent.
FAKE_BEACON = r"""
import socket, sys
server = socket.create_server(("127.0.0.1", 0))
print(server.getsockname()[1], flush=True)
held = []
while True:
    connection, _ = server.accept()
    connection.sendall(sys.argv[1].encode())
    held.append(connection)
"""

# An agent that exits through Python, as torchrun's does after SIGTERM (torch turns the signal
# into an exception once the workers stopped): its beacon says LEAVING at exit.
EXITING_AGENT = r"""
import sys
from ddpjob_trainer.rendezvous.liveness import Beacon
beacon = Beacon(sys.argv[1], "127.0.0.1")
print(beacon.port, flush=True)
sys.stdin.read()
raise RuntimeError("SignalException stands in here")
"""


def start_peer(script: str, token: str = TOKEN) -> tuple[subprocess.Popen, int]:
    process = subprocess.Popen([sys.executable, "-c", script, token], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    return process, int(process.stdout.readline())


def eventually(read, want, seconds: float = WAIT):
    deadline = time.monotonic() + seconds
    while (value := read()) != want and time.monotonic() < deadline:
        time.sleep(0.01)
    return value


@pytest.fixture()
def watch():
    watch = BeaconWatch(timeout=0.5)
    yield watch
    watch.stop()


def test_a_peer_killed_without_a_word_is_lost_at_once(watch):
    peer, port = start_peer(FAKE_BEACON)
    try:
        watch.watch([Peer("node-1", "127.0.0.1", port, TOKEN)])
        time.sleep(0.3)  # the watch connects
        assert watch.lost() == [], "alive"
        peer.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        assert eventually(watch.lost, ["node-1"]) == ["node-1"]
        print(f"noticed {time.monotonic() - killed:.3f} s after the kill")
    finally:
        peer.kill()
        peer.wait()


def test_a_beacon_closed_on_purpose_says_it_leaves_and_is_not_lost(watch):
    beacon = Beacon(TOKEN, "127.0.0.1")
    watch.watch([Peer("node-1", "127.0.0.1", beacon.port, TOKEN)])
    time.sleep(0.3)
    beacon.close()
    assert eventually(watch.left, ["node-1"]) == ["node-1"]
    assert watch.lost() == []


def test_an_agent_exiting_through_python_says_it_leaves(watch):
    """torchrun's agent after SIGTERM (a graceful stop, a scale-down): the interpreter exits and
    the beacon's exit hook writes LEAVING before the kernel closes the connection."""
    peer, port = start_peer(EXITING_AGENT)
    watch.watch([Peer("node-1", "127.0.0.1", port, TOKEN)])
    time.sleep(0.3)
    peer.stdin.close()
    assert peer.wait(timeout=60) == 1
    assert eventually(watch.left, ["node-1"]) == ["node-1"]
    assert watch.lost() == []


def test_a_probe_still_reads_the_token_of_a_beacon_that_holds_connections():
    beacon = Beacon(TOKEN, "127.0.0.1")
    try:
        started = time.monotonic()
        assert probe("127.0.0.1", beacon.port, TOKEN) is True
        assert time.monotonic() - started < 0.5, "the probe reads the token and does not wait for the close"
        assert probe("127.0.0.1", beacon.port, "b" * 32) is False
    finally:
        beacon.close()


def test_a_full_beacon_is_not_watched_and_still_answers_probes(watch, monkeypatch):
    monkeypatch.setattr(liveness, "MAX_HELD", 1)
    beacon = Beacon(TOKEN, "127.0.0.1")
    holder = socket.create_connection(("127.0.0.1", beacon.port))  # a stranger takes the one slot
    try:
        assert holder.recv(64) == TOKEN.encode()
        watch.watch([Peer("node-1", "127.0.0.1", beacon.port, TOKEN)])
        assert probe("127.0.0.1", beacon.port, TOKEN) is True
        over = socket.create_connection(("127.0.0.1", beacon.port))
        assert over.recv(64) + over.recv(64) == TOKEN.encode() + FULL
        over.close()
        time.sleep(0.5)
        assert watch.lost() == [] and watch.left() == [], "full: not watched, not lost"
    finally:
        holder.close()
        beacon.close()


def serve(server: socket.socket, handle) -> None:
    while True:
        try:
            connection, _ = server.accept()
        except OSError:
            return
        threading.Thread(target=handle, args=(connection,), daemon=True).start()


def test_a_listener_that_never_answers_costs_a_bounded_wait_and_others_are_still_watched(watch):
    silent = socket.create_server(("127.0.0.1", 0))  # the kernel accepts; nobody writes
    peer, port = start_peer(FAKE_BEACON)
    try:
        watch.watch([Peer("silent", "127.0.0.1", silent.getsockname()[1], TOKEN),
                     Peer("node-1", "127.0.0.1", port, TOKEN)])
        time.sleep(1.0)  # 0.5 s for the silent one, then node-1
        peer.send_signal(signal.SIGKILL)
        assert eventually(watch.lost, ["node-1"]) == ["node-1"]
    finally:
        silent.close()
        peer.kill()
        peer.wait()


def test_a_listener_that_trickles_or_floods_is_dropped_not_lost(watch):
    """One writes the token a byte at a time (never within the deadline); one writes the token
    and then without end. Neither is watched, neither is a loss, and the flood is cut off."""
    def trickle(connection):
        with connection, contextlib.suppress(OSError):  # the watch gives up and closes its end
            for byte in TOKEN.encode():
                time.sleep(0.2)
                connection.sendall(bytes([byte]))

    flood_cut = threading.Event()

    def flood(connection):
        with connection:
            try:
                connection.sendall(TOKEN.encode())
                while True:
                    connection.sendall(b"z" * 65536)
            except OSError:
                flood_cut.set()

    servers = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
    for server, handle in zip(servers, (trickle, flood)):
        threading.Thread(target=serve, args=(server, handle), daemon=True).start()
    try:
        watch.watch([Peer(name, "127.0.0.1", server.getsockname()[1], TOKEN)
                     for name, server in zip(("trickle", "flood"), servers)])
        assert flood_cut.wait(WAIT), "the watch closed the flooding connection"
        time.sleep(0.5)
        assert watch.lost() == []
    finally:
        for server in servers:
            server.close()


def test_a_loss_from_a_round_that_is_over_is_not_reported(watch):
    peer, port = start_peer(FAKE_BEACON)
    try:
        watch.watch([Peer("node-1", "127.0.0.1", port, TOKEN)])
        time.sleep(0.3)
        watch.forget()  # this node re-rendezvouses: the old round's peers no longer matter
        peer.send_signal(signal.SIGKILL)
        peer.wait()
        time.sleep(0.5)
        assert watch.lost() == []
    finally:
        peer.kill()


def test_a_peer_whose_beacon_refuses_from_the_start_is_not_taken_for_lost(watch):
    """Only a connection that answered the token and then closed is a loss: a refusal at the
    start says nothing about when (a clean finish may have closed it)."""
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    watch.watch([Peer("node-1", "127.0.0.1", port, TOKEN)])
    time.sleep(0.5)
    assert watch.lost() == []

