"""The operator's cache (controller/cache.py) following the real API server: its watches feed the
store, poke the right job, ask the server to filter by the operator's label, and list again
(once) when a watch expires (410 Gone). Requests are counted from the audit log.

The 410 itself is the one thing here the real server is not asked for: it sends it only to a
watch resuming from a compacted revision that its watch cache no longer holds, which takes
`--watch-cache=false` and etcd compaction (docs/development.md "Faults on the real control
plane"; tests/cluster/test_api_faults.py does that for kopf's watch), or a watch the server ended
itself after 300 s. So that test ends the cache's first pod watch with the ERROR event the server
sends then, and everything after it (the second list, the second watch, the new pod) is the
real server's. (The store itself needs no server: tests/operator/controller/test_cache.py.)"""
import asyncio
import urllib.parse

import pytest

from ddpjob_operator.api import constants as C
from ddpjob_operator.controller import cache
from ddpjob_operator.controller.cache import DISRUPTION_BUDGETS, PODS, SERVICES, ClusterCache
from ddpjob_sandbox.control_plane import audit
from ddpjob_sandbox.jobs import make_manifest

pytestmark = pytest.mark.usefixtures("ddpjob_crd")

OURS = f"{C.LABEL_MANAGED_BY}={C.MANAGED_BY}"
# Pods no scheduler binds (nobody runs this one): deleted at once, never run by a kubelet.
UNSCHEDULED = "ddpjob-test-no-scheduler"
# What the API server sends a watch resuming from a compacted revision.
GONE = {"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 410,
                                    "reason": "Expired", "message": "too old resource version: 1 (2)"}}


def pod(name, job="mlp", **labels):
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {C.LABEL_MANAGED_BY: C.MANAGED_BY, C.LABEL_INSTANCE: job, **labels}},
            "spec": {"schedulerName": UNSCHEDULED, "containers": [{"name": "trainer", "image": "trainer:1"}]}}


async def until(predicate, timeout=30.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.05)


def follow(api, kube, scenario, kinds=(PODS, SERVICES)):
    """Runs ``scenario(cache, poked)`` with a started cache of ``kinds`` in ``kube.namespace``."""
    async def main():
        poked = []
        followed = ClusterCache(api, [kube.namespace], poke=poked.append, kinds=kinds)
        followed.start()
        try:
            await asyncio.wait_for(followed.synced(), 30)
            return await scenario(followed, poked)
        finally:
            await followed.stop()
            await api.close()
    return asyncio.run(main())


def counts(found, resource=None):
    return audit.count(found, by=("verb",), **({"resource": resource} if resource else {}))


def label_selector(request: audit.Request) -> str | None:
    """The labelSelector a list or watch asked the server to filter by (None: none)."""
    [selector] = urllib.parse.parse_qs(urllib.parse.urlsplit(request.uri).query).get("labelSelector", [None])
    return selector


def test_a_pod_created_behind_the_caches_back_arrives_by_the_watch_and_pokes_its_job(kube, connect,
                                                                                     controller_requests):
    kube.create("pods", pod("before-0", "before"))
    kube.create("pods", pod("x", "x") | {"metadata": {"name": "stranger"}})  # not ours: no labels

    async def scenario(followed, poked):
        assert [p.name for p in followed.pods(kube.namespace, "before")] == ["before-0"]
        kube.create("pods", pod("mlp-node-0"))
        await until(lambda: followed.pods(kube.namespace, "mlp"))
        kube.delete("pods", "before-0")
        await until(lambda: not followed.pods(kube.namespace, "before"))
        return poked
    poked = follow(connect(), kube, scenario)
    # listed; marked for deletion (the server's MODIFIED with a deletionTimestamp); deleted
    assert (kube.namespace, "mlp") in poked and poked.count((kube.namespace, "before")) == 3
    pods = counts(controller_requests(), "pods")
    assert (pods["list"], pods["watch"], pods["get"]) == (1, 1, 0), "one list, one watch, nothing per pass"


def test_an_expired_watch_lists_again_and_goes_on_watching(kube, connect, controller_requests):
    api = connect()
    real_watch, expired = api.watch, []

    async def watch_expiring_once(api_version, plural, *args):
        if plural == "pods" and not expired:  # the server's answer to a compacted revision (docstring)
            expired.append(plural)
            yield GONE
            return
        async for event in real_watch(api_version, plural, *args):
            yield event
    api.watch = watch_expiring_once

    async def scenario(followed, poked):
        await until(lambda: counts(controller_requests(), "pods")["list"] == 2)
        kube.create("pods", pod("mlp-node-0"))
        await until(lambda: followed.pods(kube.namespace, "mlp"))
        return [p.name for p in followed.pods(kube.namespace, "mlp")]
    assert follow(api, kube, scenario) == ["mlp-node-0"]
    pods = counts(controller_requests(), "pods")
    assert (pods["list"], pods["watch"]) == (2, 1), "listed again once; only the second watch reached the server"


def test_a_service_is_known_to_exist_once_its_watch_brings_it(kube, connect):
    service = {"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "mlp", "labels": {C.LABEL_MANAGED_BY: C.MANAGED_BY}}, "spec": {"clusterIP": "None"}}

    async def scenario(followed, poked):
        before = followed.exists(SERVICES, kube.namespace, "mlp")
        kube.create("services", service)
        await until(lambda: followed.exists(SERVICES, kube.namespace, "mlp"))
        return before
    assert follow(connect(), kube, scenario) is False


def budget(name, selector_values, labels=None, owner=None):
    """A PodDisruptionBudget whose selector lists ``selector_values`` (many make it huge)."""
    meta = {"name": name, "labels": labels or {}}
    if owner:  # a real job: the garbage collector deletes what a missing owner owns
        meta["ownerReferences"] = [{"apiVersion": C.API_VERSION, "kind": C.KIND, "name": owner["metadata"]["name"],
                                    "uid": owner["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]
    return {"apiVersion": C.POLICY_API_VERSION, "kind": "PodDisruptionBudget", "metadata": meta,
            "spec": {"minAvailable": 1, "selector": {"matchExpressions": [
                {"key": "app", "operator": "In", "values": selector_values}]}}}


def test_a_foreign_budget_is_never_listed_and_ours_keep_only_what_a_pass_compares(kube, connect, controller_requests):
    huge = [f"value-{i:06d}-" + "x" * 50 for i in range(10_000)]  # a ~640 KiB selector
    mlp, grown_job = kube.create("ddpjobs", make_manifest()), kube.create("ddpjobs", make_manifest("grown"))
    kube.create("poddisruptionbudgets", budget("theirs", huge))
    kube.create("poddisruptionbudgets", budget("mlp", ["a"], {C.LABEL_MANAGED_BY: C.MANAGED_BY}, mlp))
    kube.create("poddisruptionbudgets", budget("grown", huge, {C.LABEL_MANAGED_BY: C.MANAGED_BY}, grown_job))

    async def scenario(followed, poked):
        store = followed.stores[DISRUPTION_BUDGETS.plural]
        await until(lambda: counts(controller_requests(), "poddisruptionbudgets")["watch"] == 1)
        return len(store), [store.get(kube.namespace, name) for name in ("theirs", "mlp", "grown")]
    held, (theirs, ours, grown) = follow(connect(), kube, scenario, kinds=(DISRUPTION_BUDGETS,))
    assert held == 2 and theirs is None, "a budget the operator did not make never reaches it"
    assert ours == {"metadata": {"ownerReferences": [{"uid": mlp["metadata"]["uid"], "controller": True}]},
                    "spec": {"minAvailable": 1, "selector": {"matchExpressions": [
                        {"key": "app", "operator": "In", "values": ["a"]}]}}}
    assert grown["spec"]["selector"].startswith("<not kept: ") and len(str(grown)) < 300, \
        "ours, grown by someone who may edit budgets: marked (the pass patches it back), not held"
    asked = [(r.verb, label_selector(r)) for r in controller_requests() if r.resource == "poddisruptionbudgets"]
    assert sorted(asked) == [("list", OURS), ("watch", OURS)], "the server filters: the list and the watch say what"


def test_every_kind_but_the_jobs_is_listed_and_watched_with_the_operators_label_selector(kube, connect,
                                                                                       controller_requests):
    async def scenario(followed, poked):
        await until(lambda: counts(controller_requests())["watch"] == len(followed.stores))
    follow(connect(), kube, scenario, kinds=cache.WATCHED)
    asked = {(r.resource, r.verb, label_selector(r)) for r in controller_requests()}
    assert asked == {(kind.plural, verb, OURS if kind is not cache.JOBS else None)
                     for kind in cache.WATCHED for verb in ("list", "watch")}
