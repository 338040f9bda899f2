"""kube.py sorts errors into "retry later" and "fail" (a server that only answers 503 or 400, and
one that is not there) and spaces its requests by its rate limit. Its verbs against the real API
server: tests/cluster/controller/test_kube_verbs.py."""
import asyncio

import aiohttp.web
import kopf
import pytest

from ddpjob_operator.controller import kube
from ddpjob_sandbox.procs import free_port


def connect(url: str) -> kube.Kube:
    return kube.Kube(kopf.ConnectionInfo(server=url, token="test"))


def pod(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"ddpjob.io/job-name": "mlp"}},
            "spec": {"containers": [{"name": "trainer", "image": "trainer:1"}]}}


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
