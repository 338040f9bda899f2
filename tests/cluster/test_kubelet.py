"""The node agent as the kubelet of registered Nodes on the real API server: it runs the pods the
scheduler binds to its Node as local processes, reports their status through pods/status, ends
deletions the way a kubelet does, gives each pod its own loopback address, resolves the cluster
DNS names of its pods, projects the service-account token and renews it, and restarts containers
as the pod's restartPolicy says."""
from __future__ import annotations

import contextlib
import json
import socket
import textwrap
import time
from pathlib import Path

import pytest

from ddpjob_sandbox.client import ApiError, KubeClient
from ddpjob_sandbox.control_plane.cluster import volume_body
from ddpjob_sandbox.control_plane.kubelets import NODE_LABEL, running_kubelets
from ddpjob_sandbox.node.network import pod_ip
from ddpjob_sandbox.procs import free_port
from tests.cluster.conftest import KUBELET_NAMES as NAMES
from tests.cluster.sandbox_only import KUBELETS

pytestmark = [pytest.mark.cluster, pytest.mark.sandbox_only(KUBELETS)]

WAIT = 60.0  # scheduling, a process start and a status write on a busy 2-core machine


def pod(name: str, script: str, *, env: dict | None = None, node: str | None = None, grace: int | None = None,
        **spec) -> dict:
    """A pod on the kubelets' Nodes whose container runs ``python -c script``; $TL names its
    termination-message file (a process here sees no bind mount at /dev/termination-log)."""
    env = {"TL": "/dev/termination-log", **(env or {})}
    container = {"name": "main", "image": "sandbox", "command": ["python", "-c", textwrap.dedent(script)],
                 "env": [{"name": k, "value": v} for k, v in env.items()]}
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": spec.pop("labels", {})},
            "spec": {"restartPolicy": "Never", "containers": [container], "nodeSelector": {NODE_LABEL: "true"},
                     "automountServiceAccountToken": False, **spec}}
    if node:
        body["spec"]["nodeName"] = node
    if grace is not None:
        body["spec"]["terminationGracePeriodSeconds"] = grace
    return body


def phase_in(kube: KubeClient, name: str, phases: tuple[str, ...]) -> dict:
    return kube.wait_for(lambda: (p := kube.find("pods", name)) is not None
                         and (p.get("status") or {}).get("phase") in phases and p,
                         timeout=WAIT, what=f"pod {name} in phase {phases}")


def terminated(body: dict) -> dict:
    return body["status"]["containerStatuses"][0]["state"].get("terminated") or {}


def agent_of(kubelets, node: str):
    return next(k.agent for k in kubelets if k.name == node)


def logs(kubelets) -> str:
    return "\n".join(k.agent.logs() + f"\nerrors: {k.agent.errors[-3:]}" for k in kubelets)


def test_a_pod_runs_reports_running_on_its_own_address_then_succeeds_with_its_message(kubelets, kube: KubeClient):
    kube.create("pods", pod("ok", """
        import os, time
        time.sleep(1.5)
        open(os.environ["TL"], "w").write("all done")
    """))
    running = phase_in(kube, "ok", ("Running",))
    node = running["spec"]["nodeName"]
    assert node in NAMES
    address = pod_ip(kube.namespace, "ok")
    assert (running["status"]["podIP"], running["status"]["podIPs"]) == (address, [{"ip": address}])
    assert address.startswith("127.") and not address.startswith("127.0."), "127.0.0.0/16 stays the machine's"
    done = phase_in(kube, "ok", ("Succeeded", "Failed"))
    assert done["status"]["phase"] == "Succeeded", logs(kubelets)
    assert (terminated(done)["exitCode"], terminated(done)["reason"], terminated(done)["message"]) == \
        (0, "Completed", "all done")
    assert not done["metadata"].get("finalizers"), "a kubelet holds no finalizer"


def test_a_failing_pod_reports_failed_with_its_exit_code_and_termination_message(kubelets, kube: KubeClient):
    kube.create("pods", pod("bad", """
        import os, sys
        open(os.environ["TL"], "w").write("out of patience")
        sys.exit(3)
    """))
    done = phase_in(kube, "bad", ("Succeeded", "Failed"))
    assert done["status"]["phase"] == "Failed"
    assert (terminated(done)["exitCode"], terminated(done)["reason"], terminated(done)["message"]) == \
        (3, "Error", "out of patience")


def test_deletion_waits_for_the_process_to_stop_then_the_kubelet_removes_the_pod(kubelets, kube: KubeClient):
    kube.create("pods", pod("stopper", """
        import signal, sys, time
        def stop(*_):
            print("SIGTERM, cleaning up", flush=True)
            time.sleep(1.5)
            sys.exit(0)
        signal.signal(signal.SIGTERM, stop)
        print("ready", flush=True)
        time.sleep(600)
    """, grace=4))
    running = phase_in(kube, "stopper", ("Running",))
    agent = agent_of(kubelets, running["spec"]["nodeName"])
    container = agent.wait_for_container("stopper")
    kube.wait_for(lambda: "ready" in container.log(), timeout=WAIT, what="the pod's process to start")
    kube.delete("pods", "stopper")
    terminating = kube.get("pods", "stopper")
    assert terminating["metadata"].get("deletionTimestamp"), "the API server waits for the kubelet"
    assert terminating["metadata"]["deletionGracePeriodSeconds"] == 4
    kube.wait_for(lambda: kube.find("pods", "stopper") is None, timeout=WAIT,
                  what="the kubelet deleting the pod once its process stopped")
    assert "SIGTERM, cleaning up" in container.log()
    assert container.exit_code == 0, "the process ended itself within the grace period"
    assert container.pids() == []


def test_a_process_that_ignores_sigterm_is_killed_after_the_grace_period(kubelets, kube: KubeClient):
    kube.create("pods", pod("stubborn", """
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("ready", flush=True)
        time.sleep(600)
    """, grace=2))
    running = phase_in(kube, "stubborn", ("Running",))
    container = agent_of(kubelets, running["spec"]["nodeName"]).wait_for_container("stubborn")
    kube.wait_for(lambda: "ready" in container.log(), timeout=WAIT, what="the pod's process to start")
    started = time.monotonic()
    kube.delete("pods", "stubborn")
    kube.wait_for(lambda: kube.find("pods", "stubborn") is None, timeout=WAIT, what="the pod gone")
    assert time.monotonic() - started >= 2.0, "SIGKILL only after the grace period"
    assert container.exit_code == 137


def test_a_pod_deleted_before_it_started_is_removed_at_once(kubelets, kube: KubeClient):
    body = pod("never", "pass", node=NAMES[0])
    body["spec"]["containers"][0]["command"] = ["no-such-command-here"]  # stays Pending on the node
    kube.create("pods", body)
    kube.wait_for(lambda: ((kube.get("pods", "never").get("status") or {}).get("containerStatuses") or [{}])[0]
                  .get("state", {}).get("waiting"), timeout=WAIT, what="the kubelet refusing the command")
    kube.delete("pods", "never")
    kube.wait_for(lambda: kube.find("pods", "never") is None, timeout=WAIT, what="the pod gone")


SERVE = """
    import os, socket
    server = socket.create_server((os.environ["DDPJOB_LISTEN_HOST"], int(os.environ["PORT"])))
    while True:
        conn, _ = server.accept()
        conn.sendall(os.environ["HOSTNAME"].encode())
        conn.close()
"""


def read_from(address: str, port: int) -> str:
    with socket.create_connection((address, port), timeout=5) as conn:
        return conn.recv(100).decode()


def test_two_pods_on_one_node_serve_the_same_port_each_on_its_own_address(kubelets, kube: KubeClient):
    # As every node pod serves the progress port; not 29410 itself: a process elsewhere on this
    # machine listening there on every interface (another test's trainer) would take it from both.
    port = free_port()
    for name in ("left", "right"):
        kube.create("pods", pod(name, SERVE, env={"PORT": str(port)}, node=NAMES[1]))
    addresses = {name: phase_in(kube, name, ("Running",))["status"]["podIP"] for name in ("left", "right")}
    assert addresses["left"] != addresses["right"]
    answers = kube.wait_for(lambda: _answers(addresses, port), timeout=WAIT, what=f"both pods answering on {port}")
    assert answers == {"left": "left", "right": "right"}, logs(kubelets)


def _answers(addresses: dict[str, str], port: int) -> dict[str, str] | None:
    try:
        return {name: read_from(address, port) for name, address in addresses.items()}
    except OSError:
        return None


def test_the_service_names_of_a_pod_and_a_headless_service_resolve_to_the_pods_address(kubelets, kube: KubeClient):
    ns = kube.namespace
    kube.create("services", {"metadata": {"name": "web"}, "spec": {
        "clusterIP": "None", "selector": {"app": "web"}, "ports": [{"port": 8080}]}})
    kube.create("pods", pod("web-0", SERVE, env={"PORT": "8080"}, labels={"app": "web"}, hostname="web-0",
                            subdomain="web", node=NAMES[2]))
    kube.create("pods", pod("client", """
        import os, socket, time
        seen = []
        deadline = time.monotonic() + 30  # web-0 may start after this pod
        for var in ("BY_POD", "BY_SERVICE", "SHORT"):
            host, port = os.environ[var].rsplit(":", 1)
            while True:
                try:
                    with socket.create_connection((host, int(port)), timeout=10) as conn:
                        seen.append(host + "=" + conn.recv(100).decode())
                    break
                except ConnectionRefusedError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
        open(os.environ["TL"], "w").write(" ".join(seen))
    """, env={"BY_POD": f"web-0.web.{ns}.svc.cluster.local:8080", "BY_SERVICE": f"web.{ns}.svc:8080",
              "SHORT": "web-0.web:8080"}, node=NAMES[0]))
    done = phase_in(kube, "client", ("Succeeded", "Failed"))
    address = pod_ip(ns, "web-0")
    assert terminated(done).get("message") == f"{address}=web-0 {address}=web-0 {address}=web-0", logs(kubelets)


def test_the_service_account_token_is_projected_and_logs_the_pod_in_as_its_service_account(kubelets,
                                                                                          kube: KubeClient):
    body = pod("whoami", """
        import json, os, ssl, urllib.request
        from pathlib import Path
        import yaml
        config = yaml.safe_load(Path(os.environ["KUBECONFIG"]).read_text())
        cluster, user = config["clusters"][0]["cluster"], config["users"][0]["user"]
        account = Path(cluster["certificate-authority"]).parent
        token = (account / "token").read_text()
        assert token == user["token"], "the kubeconfig carries the projected token"
        assert (account / "namespace").read_text() == config["contexts"][0]["context"]["namespace"]
        request = urllib.request.Request(
            cluster["server"] + "/apis/authentication.k8s.io/v1/selfsubjectreviews", method="POST",
            data=json.dumps({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}).encode(),
            headers={"Authorization": "Bearer " + token, "Content-Type": "application/json"})
        context = ssl.create_default_context(cafile=cluster["certificate-authority"])
        with urllib.request.urlopen(request, context=context, timeout=10) as answer:
            info = json.load(answer)["status"]["userInfo"]
        host = os.environ["KUBERNETES_SERVICE_HOST"] + ":" + os.environ["KUBERNETES_SERVICE_PORT"]
        open(os.environ["TL"], "w").write(json.dumps({"user": info["username"], "extra": info.get("extra", {}),
                                                            "host": host, "account_dir": str(account)}))
    """)
    body["spec"]["automountServiceAccountToken"] = True  # what the ServiceAccount admission plugin mounts
    kube.create("pods", body)
    done = phase_in(kube, "whoami", ("Succeeded", "Failed"))
    message = terminated(done).get("message") or ""
    assert done["status"]["phase"] == "Succeeded", f"{message}\n{logs(kubelets)}"
    seen = json.loads(message)
    assert seen["user"] == f"system:serviceaccount:{kube.namespace}:default"
    assert seen["extra"]["authentication.kubernetes.io/pod-name"] == ["whoami"], "the token is bound to the pod"
    assert seen["host"] == kube.url.removeprefix("https://")
    mounts = done["spec"]["containers"][0]["volumeMounts"]
    assert any(m["mountPath"] == "/var/run/secrets/kubernetes.io/serviceaccount" for m in mounts)
    assert not seen["account_dir"].startswith("/var/run"), "the mount is a directory of the pod on this machine"


def test_a_claim_bound_to_a_hostpath_volume_is_that_directory(kubelets, kube: KubeClient, tmp_path: Path):
    volume = f"pv-{kube.namespace}"
    kube.create("persistentvolumes", volume_body(volume, tmp_path, capacity="1Gi"))
    try:
        kube.create("persistentvolumeclaims", {"metadata": {"name": "data"}, "spec": {
            "accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": volume,
            "resources": {"requests": {"storage": "1Gi"}}}})
        body = pod("writer", """
            import os
            open(os.path.join(os.environ["DATA"], "hello.txt"), "w").write("from the pod")
        """, env={"DATA": "/data"})
        body["spec"]["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]
        body["spec"]["containers"][0]["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
        kube.create("pods", body)
        done = phase_in(kube, "writer", ("Succeeded", "Failed"))
        assert done["status"]["phase"] == "Succeeded", logs(kubelets)
        assert (tmp_path / "hello.txt").read_text() == "from the pod"
    finally:
        kube.request("DELETE", f"/api/v1/persistentvolumes/{volume}")


def test_a_kubelet_may_not_delete_or_report_for_another_nodes_pod(kubelets, kube: KubeClient):
    kube.create("pods", pod("elsewhere", "import time; time.sleep(30)", node=NAMES[0]))
    phase_in(kube, "elsewhere", ("Running",))
    other = agent_of(kubelets, NAMES[1]).client
    for attempt in (lambda: other.delete("pods", "elsewhere", kube.namespace, gracePeriodSeconds=0),
                    lambda: other.patch("pods", "elsewhere", {"status": {"phase": "Failed"}}, kube.namespace,
                                        subresource="status")):
        with pytest.raises(ApiError) as refused:
            attempt()
        assert refused.value.status == 403
    kube.delete("pods", "elsewhere", gracePeriodSeconds=1)


def container_status(body: dict) -> dict:
    return body["status"]["containerStatuses"][0]


def reported(kube: KubeClient, name: str) -> dict | None:
    """The pod once its kubelet reported its container (None before)."""
    body = kube.get("pods", name)
    return body if (body.get("status") or {}).get("containerStatuses") else None


def test_on_failure_a_failed_container_restarts_at_once_then_succeeds_with_its_restart_counted(kubelets,
                                                                                               kube: KubeClient):
    # The emptyDir outlives the container, as on a kubelet: the second run finds the first's mark.
    body = pod("flaky", """
        import os, sys
        mark = os.path.join(os.environ["SCRATCH"], "ran-once")
        if not os.path.exists(mark):
            open(mark, "w").close()
            open(os.environ["TL"], "w").write("first run fails")
            sys.exit(3)
        open(os.environ["TL"], "w").write("second run succeeds")
    """, env={"SCRATCH": "/scratch"}, restartPolicy="OnFailure")
    body["spec"]["volumes"] = [{"name": "scratch", "emptyDir": {}}]
    body["spec"]["containers"][0]["volumeMounts"] = [{"name": "scratch", "mountPath": "/scratch"}]
    kube.create("pods", body)
    done = phase_in(kube, "flaky", ("Succeeded", "Failed"))
    assert done["status"]["phase"] == "Succeeded", logs(kubelets)
    status = container_status(done)
    assert status["restartCount"] == 1
    assert (terminated(done)["exitCode"], terminated(done)["message"]) == (0, "second run succeeds")


def test_always_restarts_an_exited_container_with_a_doubling_back_off_and_the_pod_stays_running(kubelets,
                                                                                                kube: KubeClient):
    kube.create("pods", pod("looping", """
        import os, time
        open(os.environ["TL"], "w").write("exited")
        time.sleep(0.5)
    """, restartPolicy="Always"))
    # The first restart is at once; the second waits the kubelet's first back-off, 10 s.
    backing_off = kube.wait_for(
        lambda: (p := reported(kube, "looping")) and (container_status(p)["state"].get("waiting") or {}).get(
            "reason") == "CrashLoopBackOff" and p,
        timeout=WAIT, what="the pod in CrashLoopBackOff after its second exit")
    status = container_status(backing_off)
    assert backing_off["status"]["phase"] == "Running", "a restarting pod never ends"
    assert status["restartCount"] == 1 and status["ready"] is False
    assert status["state"]["waiting"]["message"].startswith("back-off 10s restarting failed container=main pod=looping_")
    assert (status["lastState"]["terminated"]["exitCode"], status["lastState"]["terminated"]["reason"],
            status["lastState"]["terminated"]["message"]) == (0, "Completed", "exited")
    waited_from = time.monotonic()
    again = kube.wait_for(lambda: (p := reported(kube, "looping")) and container_status(p)["restartCount"] == 2
                          and p, timeout=WAIT, what="the second restart")
    assert time.monotonic() - waited_from >= 8, "not before its back-off (10 s, from a moment before the wait)"
    assert container_status(again)["lastState"]["terminated"]["exitCode"] == 0
    kube.delete("pods", "looping", gracePeriodSeconds=1)
    kube.wait_for(lambda: kube.find("pods", "looping") is None, timeout=WAIT, what="a restarting pod deleted")


def test_a_never_pod_is_not_restarted(kubelets, kube: KubeClient):
    kube.create("pods", pod("once", "import sys; sys.exit(1)"))
    done = phase_in(kube, "once", ("Succeeded", "Failed"))
    time.sleep(2)  # a restart, were there one, would come at once
    after = kube.get("pods", "once")
    assert (after["status"]["phase"], container_status(after)["restartCount"]) == ("Failed", 0)
    assert done["metadata"]["uid"] == after["metadata"]["uid"]


RENEWED = """
    import base64, json, os, ssl, time, urllib.request
    from pathlib import Path
    import yaml
    config_path = Path(os.environ["KUBECONFIG"])
    cluster = yaml.safe_load(config_path.read_text())["clusters"][0]["cluster"]
    account = Path(cluster["certificate-authority"]).parent
    first = (account / "token").read_text()
    deadline = time.monotonic() + 60
    while (new := (account / "token").read_text()) == first or \\
            yaml.safe_load(config_path.read_text())["users"][0]["user"]["token"] != new:
        assert time.monotonic() < deadline, "no renewed token within 60 s"
        time.sleep(0.2)
    request = urllib.request.Request(
        cluster["server"] + "/apis/authentication.k8s.io/v1/selfsubjectreviews", method="POST",
        data=json.dumps({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}).encode(),
        headers={"Authorization": "Bearer " + new, "Content-Type": "application/json"})
    context = ssl.create_default_context(cafile=cluster["certificate-authority"])
    with urllib.request.urlopen(request, context=context, timeout=10) as answer:
        user = json.load(answer)["status"]["userInfo"]["username"]
    claims = [json.loads(base64.urlsafe_b64decode(t.split(".")[1] + "==")) for t in (first, new)]
    open(os.environ["TL"], "w").write(json.dumps({"user": user, "exp": [c["exp"] for c in claims]}))
"""


def test_a_projected_token_is_renewed_before_it_expires_and_the_new_one_logs_in(control_plane, kube: KubeClient,
                                                                                 tmp_path: Path):
    # A kubelet of its own that renews at 1% of the lifetime (the API's shortest, 600 s): 6 s, not 480.
    with contextlib.ExitStack() as stack:
        stack.callback(kube.delete, "nodes", "renewer")  # no later pod is scheduled to a Node without kubelet
        stack.enter_context(running_kubelets(control_plane.layout.pki, control_plane.url, tmp_path, ("renewer",),
                                             heartbeat_seconds=2.0, poll_seconds=0.2, token_renew_fraction=0.01))
        body = pod("renewed", RENEWED, node="renewer")
        body["spec"]["volumes"] = [{"name": "short-lived", "projected": {"sources": [
            {"serviceAccountToken": {"path": "token", "expirationSeconds": 600}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace",
                                        "fieldRef": {"fieldPath": "metadata.namespace"}}]}}]}}]
        body["spec"]["containers"][0]["volumeMounts"] = [{"name": "short-lived",
                                                          "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]
        kube.create("pods", body)
        done = phase_in(kube, "renewed", ("Succeeded", "Failed"))
    message = terminated(done).get("message") or ""
    assert done["status"]["phase"] == "Succeeded", message
    seen = json.loads(message)
    assert seen["user"] == f"system:serviceaccount:{kube.namespace}:default"
    first, renewed = seen["exp"]
    assert renewed > first, "the renewed token expires later"
