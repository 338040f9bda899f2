"""kube.py's verbs are idempotent and sort errors into "skip", "retry later" and "fail",
checked against the API emulator (and a server that only answers 503) over HTTP."""
import asyncio

import aiohttp.web
import kopf
import pytest

from ddpjob_operator.controller import kube
from ddpjob_sandbox.jobs import make_manifest
from ddpjob_sandbox.procs import free_port


def connect(url: str) -> kube.Kube:
    return kube.Kube(kopf.ConnectionInfo(server=url, token="test"))


def pod(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"ddpjob.io/job-name": "mlp"}},
            "spec": {"containers": [{"name": "trainer", "image": "trainer:1"}]}}


def run(url, scenario):
    """Runs ``scenario(api)`` with a fresh client to ``url`` and closes the client."""
    async def with_client():
        api = connect(url)
        try:
            return await scenario(api)
        finally:
            await api.close()
    return asyncio.run(with_client())


def test_create_or_skip_creates_once_and_then_skips(k8s):
    async def scenario(api):
        return [await api.create_or_skip(pod("p0"), k8s.namespace), await api.create_or_skip(pod("p0"), k8s.namespace)]
    assert run(k8s.url, scenario) == [True, False]
    assert [p["metadata"]["name"] for p in k8s.list("pods")] == ["p0"]


def owned(name: str, uid: str) -> dict:
    body = pod(name)
    body["metadata"]["ownerReferences"] = [{"apiVersion": "ddpjob.io/v1alpha1", "kind": "DDPJob", "name": "mlp",
                                            "uid": uid, "controller": True}]
    return body


def test_a_409_on_an_object_the_job_controls_is_skipped_and_on_anyone_elses_is_refused_by_name(k8s):
    k8s.create("pods", owned("mlp-node-0", "uid-mlp"))  # ours, from a pass before a restart
    k8s.create("pods", pod("mlp-node-1"))  # someone's pod without an owner, bearing our name
    k8s.create("pods", owned("mlp-node-2", "uid-other"))  # another job's

    async def scenario(api):
        outcomes = [await api.create_or_skip(owned("mlp-node-0", "uid-mlp"), k8s.namespace)]
        for name in ("mlp-node-1", "mlp-node-2"):
            try:
                outcomes.append(await api.create_or_skip(owned(name, "uid-mlp"), k8s.namespace))
            except kube.ForeignObjectError as e:
                outcomes.append((e.status, e.reason, e.api_message))
        return outcomes
    skipped, no_owner, other = run(k8s.url, scenario)
    assert skipped is False
    assert no_owner == (409, "ForeignObject", (
        "Pod 'mlp-node-1' already exists and has no controller, not by DDPJob 'mlp' (uid uid-mlp): the operator "
        "neither adopts nor replaces it; delete or rename it so the job can create its own"))
    assert other[2].startswith("Pod 'mlp-node-2' already exists and is controlled by DDPJob 'mlp' (uid uid-other)")


def test_delete_or_skip_skips_missing_pods_and_newer_pods_of_the_same_name(k8s):
    stale_uid = k8s.create("pods", pod("p0"))["metadata"]["uid"]
    k8s.delete("pods", "p0")
    k8s.create("pods", pod("p0"))  # a replacement with a new uid

    async def scenario(api):
        return [await api.delete_or_skip("Pod", k8s.namespace, "p0", stale_uid),
                await api.delete_or_skip("Pod", k8s.namespace, "ghost")]
    assert run(k8s.url, scenario) == [False, False]
    assert k8s.find("pods", "p0") is not None, "the newer pod must survive a delete aimed at the old uid"


def test_a_budget_is_read_patched_and_a_missing_one_is_none_or_skipped(k8s):
    budget = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "mlp"},
              "spec": {"minAvailable": 1, "selector": {"matchLabels": {"ddpjob.io/job-name": "mlp"}}}}

    async def scenario(api):
        missing = await api.get_or_none("PodDisruptionBudget", k8s.namespace, "mlp")
        skipped = await api.patch_or_skip("PodDisruptionBudget", k8s.namespace, "mlp", {"spec": {"minAvailable": 2}})
        await api.create_or_skip(budget, k8s.namespace)
        patched = await api.patch_or_skip("PodDisruptionBudget", k8s.namespace, "mlp", {"spec": {"minAvailable": 3}})
        read = await api.get_or_none("PodDisruptionBudget", k8s.namespace, "mlp")
        return missing, skipped, patched, read["spec"]
    assert run(k8s.url, scenario) == (None, False, True, {**budget["spec"], "minAvailable": 3})


def test_status_patch_writes_only_the_status_and_skips_a_deleted_job(k8s):
    k8s.create("ddpjobs", make_manifest())

    async def scenario(api):
        patched = await api.patch_job_status(k8s.namespace, "mlp", {"phase": "Running", "restarts": 0})
        missing = await api.patch_job_status(k8s.namespace, "ghost", {"phase": "Running"})
        return patched, missing
    patched, missing = run(k8s.url, scenario)
    assert patched["status"] == {"phase": "Running", "restarts": 0} and missing is None
    assert k8s.get("ddpjobs", "mlp")["metadata"]["generation"] == 1


def test_events_name_the_job_and_the_operator(k8s):
    job = k8s.create("ddpjobs", make_manifest())

    async def scenario(api):
        await api.post_event(job, "Warning", "NodeFailed", "node pod mlp-node-1 failed (exit code 1)")
    run(k8s.url, scenario)
    [event] = k8s.list("events")
    assert event["involvedObject"]["uid"] == job["metadata"]["uid"]
    assert (event["type"], event["reason"], event["source"]["component"]) == ("Warning", "NodeFailed",
                                                                                "ddpjob-operator")


def test_a_busy_server_becomes_a_temporary_error_and_a_bad_request_an_api_error():
    port = free_port()

    async def scenario():
        app = aiohttp.web.Application()
        app.router.add_route("POST", "/api/v1/namespaces/ns/pods",
                             lambda _: aiohttp.web.Response(status=503, text="<html>overloaded</html>",
                                                            headers={"Retry-After": "5"}))
        app.router.add_route("GET", "/api/v1/namespaces/ns/pods",
                             lambda _: aiohttp.web.json_response({"reason": "BadRequest", "message": "bad"},
                                                                 status=400))
        runner = aiohttp.web.AppRunner(app)
        await runner.setup()
        await aiohttp.web.TCPSite(runner, "127.0.0.1", port).start()
        api = connect(f"http://127.0.0.1:{port}")
        try:
            with pytest.raises(kopf.TemporaryError, match="503") as busy:
                await api.create_or_skip(pod("p0"), "ns")
            assert (busy.value.status, busy.value.api_message, busy.value.retry_after) == (
                503, "<html>overloaded</html>", 5.0)
            with pytest.raises(kube.ApiError, match="400 BadRequest: bad") as bad:
                await api.list_objects("v1", "pods", "ns", "a=b")
            assert (bad.value.status, bad.value.reason, bad.value.api_message) == (400, "BadRequest", "bad")
        finally:
            await api.close()
            await runner.cleanup()
        unreachable = connect(f"http://127.0.0.1:{free_port()}")
        try:
            with pytest.raises(kopf.TemporaryError):
                await unreachable.list_objects("v1", "pods", "ns", "a=b")
        finally:
            await unreachable.close()

    asyncio.run(scenario())


def test_the_rate_limit_lets_a_burst_through_at_once_then_spaces_requests_by_qps():
    async def scenario():
        rate, loop = kube.RateLimit(qps=20, burst=3), asyncio.get_running_loop()
        started = loop.time()
        for _ in range(3):
            await rate.wait()
        burst = loop.time() - started
        for _ in range(4):
            await rate.wait()
        return burst, loop.time() - started
    burst, total = asyncio.run(scenario())
    assert burst < 0.1 and 0.18 <= total < 1.5, (burst, total)  # 4 more at 20/s: 0.2 s (the rest: a loaded machine)


def test_a_rate_of_zero_never_waits():
    async def scenario():
        rate, loop = kube.RateLimit(qps=0, burst=1), asyncio.get_running_loop()
        started = loop.time()
        for _ in range(1000):
            await rate.wait()
        return loop.time() - started
    assert asyncio.run(scenario()) < 0.5
