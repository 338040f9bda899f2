"""The sandbox node agent on its own: pods with trivial commands (no torch, no operator) run as
local processes and their status reads as a kubelet writes it."""
from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ddpjob_sandbox.procs import free_port, marked_pids
from ddpjob_sandbox.node.reporting import FINALIZER
from ddpjob_sandbox.node.launch import UnsupportedPodError, container_launch, map_hosts, POD_ENV
from ddpjob_sandbox.node import running_node_agent


def make_pod(name: str, script: str, *, env: dict | None = None, volumes: list | None = None,
             mounts: list | None = None, grace: int | None = None, hostname: str = "") -> dict:
    """A pod whose container runs ``python -c script`` (``python`` resolves to this virtualenv)."""
    container = {"name": "trainer", "image": "sandbox", "command": ["python", "-c", textwrap.dedent(script)],
                 "env": [{"name": k, "value": v} for k, v in (env or {}).items()],
                 "volumeMounts": mounts or []}
    spec = {"restartPolicy": "Never", "containers": [container], "volumes": volumes or []}
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    if hostname:
        spec["hostname"] = hostname
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def terminated(pod: dict) -> dict:
    return pod["status"]["containerStatuses"][0]["state"].get("terminated") or {}


def wait_phase(k8s, name: str, phases: tuple[str, ...], timeout: float = 20) -> dict:
    return k8s.wait_for(lambda: (p := k8s.find("pods", name)) is not None
                        and (p.get("status") or {}).get("phase") in phases and p,
                        timeout=timeout, what=f"pod {name} in phase {phases}")


CLAIM = [{"name": "data", "persistentVolumeClaim": {"claimName": "shared"}}, {"name": "scratch", "emptyDir": {}}]
CLAIM_MOUNTS = [{"name": "data", "mountPath": "/data"}, {"name": "scratch", "mountPath": "/scratch"}]


# ----------------------------------------------------------------------------- pure mapping


def pod_object(**kwargs) -> dict:
    body = make_pod("mlp-node-1", "pass", **kwargs)
    body["metadata"].update(namespace="ns", uid="u-1")
    return body


def test_a_claim_is_one_shared_directory_and_env_paths_under_its_mount_move_there(tmp_path):
    pod = pod_object(env={"DDPJOB_SNAPSHOT_DIR": "/data", "OUT": "/data/run/metrics.jsonl", "TMP": "/scratch/x",
                          "OTHER": "/database"}, volumes=CLAIM, mounts=CLAIM_MOUNTS)
    launch = container_launch(pod, tmp_path, [], {"PATH": "/bin", "PET_NNODES": "9", "DDPJOB_JOB_NAME": "stale"})
    assert launch.env["DDPJOB_SNAPSHOT_DIR"] == str(tmp_path / "claims" / "ns" / "shared")
    assert launch.env["OUT"] == str(tmp_path / "claims" / "ns" / "shared" / "run" / "metrics.jsonl")
    assert launch.env["TMP"] == str(tmp_path / "pods" / "ns_mlp-node-1_u-1" / "volumes" / "scratch" / "x")
    assert launch.env["OTHER"] == "/database", "a path that only starts with the same letters is not under the mount"
    assert launch.env["PATH"] == "/bin" and "PET_NNODES" not in launch.env and "DDPJOB_JOB_NAME" not in launch.env


def test_cluster_dns_names_of_pods_and_services_resolve_to_loopback():
    assert map_hosts("mlp-node-0.mlp.ns.svc.cluster.local:29400", "ns", []) == "127.0.0.1:29400"
    assert map_hosts("etcd.infra.svc:2379,etcd-1.etcd.infra.svc.cluster.local:2379", "ns", []) == \
        "127.0.0.1:2379,127.0.0.1:2379"
    assert map_hosts("mlp-node-0.mlp:29400", "ns", ["mlp"]) == "127.0.0.1:29400"
    assert map_hosts("mlp-node-0.mlp.ns:29400", "ns", ["mlp"]) == "127.0.0.1:29400"
    assert map_hosts("example.com:443", "ns", ["mlp"]) == "example.com:443"
    assert map_hosts("ddpjob_trainer.examples.mlp", "ns", ["mlp"]) == "ddpjob_trainer.examples.mlp"


def test_torchrun_resolves_to_the_one_next_to_this_interpreter(tmp_path):
    pod = pod_object()
    pod["spec"]["containers"][0].update(command=["torchrun"], args=["-m", "ddpjob_trainer.examples.mlp"])
    launch = container_launch(pod, tmp_path, [], {})
    assert launch.argv == [str(Path(sys.executable).parent / "torchrun"), "-m", "ddpjob_trainer.examples.mlp"]


def test_an_image_the_node_maps_runs_in_its_environment_without_this_machines_python_path(tmp_path):
    image_env = tmp_path / "torch-only"
    (image_env / "bin").mkdir(parents=True)
    (image_env / "bin" / "torchrun").touch()
    pod = pod_object()
    pod["spec"]["containers"][0].update(image="pytorch/pytorch:2", command=["torchrun"], args=["/w/train.py"])
    machine = {"PATH": "/bin", "PYTHONPATH": "/repo/trainer", "VIRTUAL_ENV": "/repo/.venv", "HOME": "/root"}

    mapped = container_launch(pod, tmp_path, [], machine, {"pytorch/pytorch:2": image_env})
    assert mapped.argv == [str(image_env / "bin" / "torchrun"), "/w/train.py"]
    assert mapped.env["PATH"] == f"{image_env / 'bin'}:/bin" and mapped.env["HOME"] == "/root"
    assert "PYTHONPATH" not in mapped.env and "VIRTUAL_ENV" not in mapped.env
    other = container_launch(pod, tmp_path, [], machine, {"another/image:1": image_env})
    assert other.argv[0] == str(Path(sys.executable).parent / "torchrun") and other.env["PYTHONPATH"] == "/repo/trainer"


@pytest.mark.parametrize("change, message", [
    (lambda pod: pod["spec"]["volumes"].append({"name": "host", "hostPath": {"path": "/etc"}}),
     "volume 'host' is a hostPath; the sandbox node supports persistentVolumeClaim, emptyDir and projected"),
    (lambda pod: pod["spec"]["containers"][0]["env"].append({"name": "K", "valueFrom": {"secretKeyRef": {}}}),
     "env K uses valueFrom secretKeyRef; the sandbox node takes literal values and fieldRef only"),
    (lambda pod: pod["spec"]["containers"][0]["env"].append(
        {"name": "L", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['a']"}}}),
     r"env fieldRef.fieldPath \"metadata.labels\['a'\]\" is not provided by the sandbox node"),
    (lambda pod: pod["spec"]["containers"][0].update(command=["no-such-binary-here"]),
     'command "no-such-binary-here" is not found'),
])
def test_what_one_machine_cannot_provide_is_refused_by_name(tmp_path, change, message):
    pod = pod_object()
    change(pod)
    with pytest.raises(UnsupportedPodError, match=message):
        container_launch(pod, tmp_path, [], {})


def test_env_naming_the_termination_message_path_points_at_the_pods_own_file(tmp_path):
    launch = container_launch(pod_object(env={"DDPJOB_TERMINATION_LOG": "/dev/termination-log"}), tmp_path, [], {})
    assert launch.termination_log == tmp_path / "pods" / "ns_mlp-node-1_u-1" / "termination-log"
    assert launch.env["DDPJOB_TERMINATION_LOG"] == str(launch.termination_log)


# ----------------------------------------------------------------------------- against the API


def test_a_pod_runs_with_its_env_and_volumes_and_succeeds(k8s, node_agent):
    script = """
        import json, os, socket
        socket.create_connection((os.environ["PEER"].split(":")[0], int(os.environ["PEER"].split(":")[1]))).close()
        with open(os.path.join(os.environ["OUT"], "seen.json"), "w") as f:
            json.dump({"hostname": os.environ["HOSTNAME"], "cwd": os.getcwd()}, f)
    """
    with __import__("socket").create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        pod = make_pod("probe", script, env={"OUT": "/data", "PEER": f"x.y.svc.cluster.local:{port}"},
                       volumes=CLAIM, mounts=CLAIM_MOUNTS, hostname="probe-host")
        k8s.create("pods", pod)
        done = wait_phase(k8s, "probe", ("Succeeded", "Failed"))
    assert done["status"]["phase"] == "Succeeded", node_agent.logs()
    assert terminated(done)["exitCode"] == 0 and terminated(done)["reason"] == "Completed"
    assert done["status"]["podIP"] == "127.0.0.1"
    assert FINALIZER in done["metadata"]["finalizers"], "a running pod holds the node's finalizer until deleted"
    seen = json.loads((node_agent.claim_dir("shared") / "seen.json").read_text())
    assert seen["hostname"] == "probe-host"
    assert Path(seen["cwd"]).is_relative_to(node_agent.root)


def test_an_exit_code_is_reported_with_a_failed_phase(k8s, node_agent):
    k8s.create("pods", make_pod("crash", "raise SystemExit(3)"))
    done = wait_phase(k8s, "crash", ("Succeeded", "Failed"))
    assert done["status"]["phase"] == "Failed"
    assert terminated(done)["exitCode"] == 3 and terminated(done)["reason"] == "Error"


SESSION_CHILD = """
    import subprocess, sys, time
    # Like torchrun's workers: a child in a session of its own, out of reach of the parent's group.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    open("child.pid", "w").write(str(child.pid))
    time.sleep(600)
"""


def test_killing_a_pod_kills_its_whole_process_tree_and_reads_as_exit_137(k8s, node_agent):
    k8s.create("pods", make_pod("node", SESSION_CHILD))
    wait_phase(k8s, "node", ("Running",))
    container = node_agent.wait_for_container("node")
    k8s.wait_for(lambda: len(container.pids()) == 2, what="the pod's main process and its own-session child")
    node_agent.kill("node")
    done = wait_phase(k8s, "node", ("Failed",))
    assert terminated(done)["exitCode"] == 137 and terminated(done)["reason"] == "Error"
    k8s.wait_for(lambda: not marked_pids(container.uid, key=POD_ENV), timeout=5, what="no process of the pod left")


def test_when_the_main_process_exits_what_it_left_behind_dies_with_the_container(k8s, node_agent):
    main_leaves_at_once = SESSION_CHILD.rsplit("time.sleep(600)", 1)[0]
    k8s.create("pods", make_pod("leaver", main_leaves_at_once))
    done = wait_phase(k8s, "leaver", ("Succeeded", "Failed"))
    container = node_agent.wait_for_container("leaver")
    assert done["status"]["phase"] == "Succeeded"
    child = int((container.log_path.parent / "cwd" / "child.pid").read_text())
    k8s.wait_for(lambda: not os.path.exists(f"/proc/{child}") or _zombie(child), timeout=5,
                 what="the orphaned child killed with its container")


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_deleting_a_pod_sends_sigterm_and_the_pod_stays_until_its_process_is_gone(k8s, node_agent):
    script = """
        import signal, sys, time
        def bye(*_):
            time.sleep(0.5)  # cleaning up: the pod must still exist meanwhile
            open("terminated", "w").write("yes")
            sys.exit(0)
        signal.signal(signal.SIGTERM, bye)
        print("ready", flush=True)
        time.sleep(600)
    """
    k8s.create("pods", make_pod("graceful", script, grace=10))
    wait_phase(k8s, "graceful", ("Running",))
    container = node_agent.wait_for_container("graceful")
    k8s.wait_for(lambda: "ready" in container.log(), what="the SIGTERM handler installed")
    k8s.delete("pods", "graceful")
    assert k8s.find("pods", "graceful")["metadata"]["deletionTimestamp"], "deletion waits for the node"
    k8s.wait_for(lambda: k8s.find("pods", "graceful") is None, timeout=10, what="the pod removed after its exit")
    assert (container.log_path.parent / "cwd" / "terminated").read_text() == "yes"
    assert container.exit_code == 0


def test_a_process_that_ignores_sigterm_is_killed_after_the_grace_period(k8s, node_agent):
    script = """
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("ready", flush=True)
        time.sleep(600)
    """
    k8s.create("pods", make_pod("stubborn", script, grace=1))
    wait_phase(k8s, "stubborn", ("Running",))
    container = node_agent.wait_for_container("stubborn")
    k8s.wait_for(lambda: "ready" in container.log(), what="SIGTERM ignored")
    deleted_at = time.monotonic()
    k8s.delete("pods", "stubborn")
    k8s.wait_for(lambda: k8s.find("pods", "stubborn") is None, timeout=10, what="the pod removed")
    assert 1.0 <= time.monotonic() - deleted_at < 5, "SIGKILL follows SIGTERM after the 1 s grace period"
    assert container.exit_code == 137


def test_a_pod_the_node_cannot_run_stays_pending_with_the_reason(k8s, node_agent):
    pod = make_pod("secretive", "pass", volumes=[{"name": "creds", "secret": {"secretName": "s"}},
                                                 {"name": "host", "hostPath": {"path": "/etc"}}])
    k8s.create("pods", pod)
    waiting = k8s.wait_for(lambda: ((k8s.get("pods", "secretive").get("status") or {}).get("containerStatuses")
                                    or [{}])[0].get("state", {}).get("waiting"), what="a waiting reason")
    assert waiting["reason"] == "CreateContainerConfigError"
    assert "volume 'host' is a hostPath" in waiting["message"]
    assert k8s.get("pods", "secretive")["status"]["phase"] == "Pending"


def test_the_pod_listening_on_a_port_is_found(k8s, node_agent):
    port = free_port()
    script = f"""
        import socket, time
        server = socket.create_server(("127.0.0.1", {port}))
        print("listening", flush=True)
        time.sleep(600)
    """
    k8s.create("pods", make_pod("host", script))
    k8s.create("pods", make_pod("guest", "import time; print('listening', flush=True); time.sleep(600)"))
    for name in ("host", "guest"):
        container = node_agent.wait_for_container(name)
        k8s.wait_for(lambda: "listening" in container.log(), what=f"{name} started")
    assert node_agent.pod_listening_on(port) == "host"
    assert node_agent.pod_listening_on(free_port()) is None


def test_stopping_the_agent_kills_every_process_it_started(k8s, tmp_path):
    with running_node_agent(k8s, tmp_path / "node") as agent:
        k8s.create("pods", make_pod("left-running", SESSION_CHILD))
        container = agent.wait_for_container("left-running")
        k8s.wait_for(lambda: len(container.pids()) == 2, what="both processes started")
    assert marked_pids(container.uid, key=POD_ENV) == []


def test_the_termination_message_file_reaches_the_terminated_state(k8s, node_agent):
    script = """
        import os
        with open(os.environ["REPORT"], "w") as f:
            f.write('{"kind": "report", "step": 42}  ')
    """
    k8s.create("pods", make_pod("reporter", script, env={"REPORT": "/dev/termination-log"}))
    done = wait_phase(k8s, "reporter", ("Succeeded", "Failed"))
    assert terminated(done)["message"] == '{"kind": "report", "step": 42}'


@pytest.mark.parametrize("code, expected", [(2, "line 99"), (0, None)])
def test_fallback_to_logs_puts_the_log_tail_in_the_message_only_after_a_failure(k8s, node_agent, code, expected):
    pod = make_pod("chatty", f"for i in range(100): print('line', i)\nraise SystemExit({code})")
    pod["spec"]["containers"][0]["terminationMessagePolicy"] = "FallbackToLogsOnError"
    k8s.create("pods", pod)
    message = terminated(wait_phase(k8s, "chatty", ("Succeeded", "Failed"))).get("message")
    if expected is None:
        assert message is None
    else:
        lines = message.splitlines()
        assert lines[-1] == expected and len(lines) == 80, "the kubelet keeps the last 80 lines"
