"""The sandbox node agent as the kubelet of the real control plane's Nodes: pods with trivial
commands (no torch, no operator), bound by the real scheduler, run as local process trees whose
status reads as a kubelet writes it. What tests/cluster/test_kubelet.py proves (phases, exit
codes, messages, graceful deletion, addresses, DNS, tokens) is not repeated here."""
from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from ddpjob_sandbox.client import KubeClient
from ddpjob_sandbox.control_plane.cluster import volume_body
from ddpjob_sandbox.control_plane.kubelets import Containers, joining_kubelet
from ddpjob_sandbox.node.launch import POD_ENV
from ddpjob_sandbox.procs import free_port, marked_pids
from tests.cluster.conftest import HEARTBEAT_SECONDS
from tests.cluster.test_kubelet import WAIT, phase_in, pod, terminated
from tests.cluster.sandbox_only import KUBELETS

pytestmark = [pytest.mark.cluster, pytest.mark.sandbox_only(KUBELETS)]

SESSION_CHILD = """
    import subprocess, sys, time
    # Like torchrun's workers: a child in a session of its own, out of reach of the parent's group.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    open("child.pid", "w").write(str(child.pid))
    time.sleep(600)
"""


def test_a_pod_runs_with_its_env_and_volumes_and_succeeds(containers: Containers, kube: KubeClient,
                                                          tmp_path: Path):
    volume = f"pv-{kube.namespace}"
    kube.create("persistentvolumes", volume_body(volume, tmp_path / "claim", capacity="1Gi"))
    try:
        kube.create("persistentvolumeclaims", {"metadata": {"name": "shared"}, "spec": {
            "accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": volume,
            "resources": {"requests": {"storage": "1Gi"}}}})
        script = """
            import json, os, socket
            host, port = os.environ["PEER"].rsplit(":", 1)
            socket.create_connection((host, int(port)), timeout=10).close()
            open(os.path.join(os.environ["SCRATCH"], "x"), "w").write("scratch")
            with open(os.path.join(os.environ["OUT"], "seen.json"), "w") as f:
                json.dump({"hostname": os.environ["HOSTNAME"], "cwd": os.getcwd(), "scratch": os.environ["SCRATCH"]}, f)
        """
        # A name of another namespace's Service is no pod of this one: it stays this machine's loopback.
        with socket.create_server(("127.0.0.1", 0)) as server:
            volumes = [{"name": "data", "persistentVolumeClaim": {"claimName": "shared"}},
                       {"name": "scratch", "emptyDir": {}}]
            body = pod("probe", script, env={"OUT": "/data", "SCRATCH": "/scratch",
                                             "PEER": f"x.y.svc.cluster.local:{server.getsockname()[1]}"},
                       hostname="probe-host", volumes=volumes)
            body["spec"]["containers"][0]["volumeMounts"] = [{"name": "data", "mountPath": "/data"},
                                                             {"name": "scratch", "mountPath": "/scratch"}]
            kube.create("pods", body)
            done = phase_in(kube, "probe", ("Succeeded", "Failed"))
        assert done["status"]["phase"] == "Succeeded", containers.logs()
        assert (terminated(done)["exitCode"], terminated(done)["reason"]) == (0, "Completed")
        seen = json.loads((containers.claim_dir("shared") / "seen.json").read_text())
        assert seen["hostname"] == "probe-host"
        node = next(k for k in containers.kubelets if k.name == done["spec"]["nodeName"])
        assert Path(seen["cwd"]).is_relative_to(node.agent.root), "the pod works in its Node's directory"
        assert Path(seen["scratch"]).is_relative_to(node.agent.root) and (Path(seen["scratch"]) / "x").exists()
    finally:
        kube.request("DELETE", f"/api/v1/persistentvolumes/{volume}")


def test_killing_a_pod_kills_its_whole_process_tree_and_reads_as_exit_137(containers: Containers,
                                                                          kube: KubeClient):
    kube.create("pods", pod("node", SESSION_CHILD))
    phase_in(kube, "node", ("Running",))
    container = containers.wait_for_container("node")
    kube.wait_for(lambda: len(container.pids()) == 2, timeout=WAIT,
                  what="the pod's main process and its own-session child")
    containers.kill("node")
    done = phase_in(kube, "node", ("Failed",))
    assert (terminated(done)["exitCode"], terminated(done)["reason"]) == (137, "Error")
    kube.wait_for(lambda: not marked_pids(container.uid, key=POD_ENV), timeout=5, what="no process of the pod left")


def test_when_the_main_process_exits_what_it_left_behind_dies_with_the_container(containers: Containers,
                                                                                 kube: KubeClient):
    main_leaves_at_once = SESSION_CHILD.rsplit("time.sleep(600)", 1)[0]
    kube.create("pods", pod("leaver", main_leaves_at_once))
    done = phase_in(kube, "leaver", ("Succeeded", "Failed"))
    container = containers.wait_for_container("leaver")
    assert done["status"]["phase"] == "Succeeded", containers.logs()
    child = int((container.log_path.parent / "cwd" / "child.pid").read_text())
    kube.wait_for(lambda: not os.path.exists(f"/proc/{child}") or _zombie(child), timeout=5,
                  what="the orphaned child killed with its container")


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_pod_the_node_cannot_run_stays_pending_with_the_reason(containers: Containers, kube: KubeClient):
    # The test namespace enforces no Pod Security level, so the API server admits the hostPath.
    kube.create("pods", pod("host-path", "pass", volumes=[{"name": "host", "hostPath": {"path": "/etc"}}]))
    waiting = kube.wait_for(lambda: ((kube.get("pods", "host-path").get("status") or {}).get("containerStatuses")
                                     or [{}])[0].get("state", {}).get("waiting"), timeout=WAIT, what="a waiting reason")
    assert waiting["reason"] == "CreateContainerConfigError"
    assert "volume 'host' is a hostPath" in waiting["message"]
    assert kube.get("pods", "host-path")["status"]["phase"] == "Pending"
    assert containers.current("host-path") is None


def test_the_pod_listening_on_a_port_is_found(containers: Containers, kube: KubeClient):
    port = free_port()
    kube.create("pods", pod("host", f"""
        import os, socket, time
        server = socket.create_server((os.environ["DDPJOB_LISTEN_HOST"], {port}))
        print("listening", flush=True)
        time.sleep(600)
    """))
    kube.create("pods", pod("guest", "import time; print('listening', flush=True); time.sleep(600)"))
    for name in ("host", "guest"):
        container = containers.wait_for_container(name, WAIT)
        kube.wait_for(lambda: "listening" in container.log(), timeout=WAIT, what=f"{name} started")
    assert containers.pod_listening_on(port) == "host"
    assert containers.pod_listening_on(free_port()) is None


def test_stopping_a_kubelet_kills_every_process_it_started(control_plane, kube: KubeClient, tmp_path: Path):
    name = f"stopped-{kube.namespace}"
    with joining_kubelet(kube, control_plane.layout.pki, control_plane.url, name, tmp_path,
                         heartbeat_seconds=HEARTBEAT_SECONDS, poll_seconds=0.2) as kubelet:
        kube.create("pods", pod("left-running", SESSION_CHILD, node=name))
        container = Containers([kubelet], kube).wait_for_container("left-running", WAIT)
        kube.wait_for(lambda: len(container.pids()) == 2, timeout=WAIT, what="both processes started")
    assert marked_pids(container.uid, key=POD_ENV) == []


@pytest.mark.parametrize("code, expected", [(2, "line 99"), (0, None)])
def test_fallback_to_logs_puts_the_log_tail_in_the_message_only_after_a_failure(containers: Containers,
                                                                                kube: KubeClient, code, expected):
    body = pod("chatty", f"for i in range(100): print('line', i)\nraise SystemExit({code})")
    body["spec"]["containers"][0]["terminationMessagePolicy"] = "FallbackToLogsOnError"
    kube.create("pods", body)
    message = terminated(phase_in(kube, "chatty", ("Succeeded", "Failed"))).get("message")
    if expected is None:
        assert message is None
    else:
        lines = message.splitlines()
        assert lines[-1] == expected and len(lines) == 80, "the kubelet keeps the last 80 lines"
