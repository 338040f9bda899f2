"""The operator's cache (controller/cache.py): a store that keeps the newest copy of each object
and re-lists honestly, and watches against the API emulator that feed it, poke the right job,
and list again (once) when the server expires a watch (410 Gone)."""
import asyncio

import kopf

from ddpjob_operator.api import constants as C
from ddpjob_operator.controller import cache, kube
from ddpjob_operator.controller.cache import DISRUPTION_BUDGETS, JOBS, PODS, SERVICES, ClusterCache, Store

AGENT = (C.MANAGED_BY,)


def pod(name, job="mlp", version="1", namespace="ns", **labels):
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "resourceVersion": version,
                         "labels": {C.LABEL_MANAGED_BY: C.MANAGED_BY, C.LABEL_INSTANCE: job, **labels}},
            "spec": {"containers": [{"name": "trainer", "image": "trainer:1"}]}}


def job(version, phase):
    return {"metadata": {"name": "mlp", "namespace": "ns", "resourceVersion": version}, "status": {"phase": phase}}


# ---------------------------------------------------------------------------- the store


def test_an_older_copy_of_a_job_never_replaces_a_newer_one():
    store = Store(JOBS)
    assert store.put(job("5", "Running"))
    assert not store.put(job("4", "Pending")), "a late watch event older than our own PATCH's answer"
    assert store.get("ns", "mlp")["status"] == {"phase": "Running"}


def test_a_deleted_object_stays_out_when_an_older_copy_arrives_late():
    store = Store(JOBS)
    store.put(job("5", "Running"))
    store.remove(job("6", "Running"))
    assert not store.put(job("5", "Running")) and store.get("ns", "mlp") is None


def test_tombstones_of_deleted_objects_are_bounded_in_count_without_a_relist(monkeypatch):
    monkeypatch.setattr(cache, "MAX_TOMBSTONES", 100)
    store = Store(PODS)
    for i in range(1000):  # pods come and go for weeks; the watch never expires
        store.put(pod(f"mlp-node-{i}", version=str(2 * i + 1)))
        store.remove(pod(f"mlp-node-{i}", version=str(2 * i + 2)))
    assert store.tombstones == 100 and len(store) == 0
    assert not store.put(pod("mlp-node-999", version="1")), "the newest deletions still keep late copies out"
    assert store.put(pod("mlp-node-0", version="1")), "the oldest were forgotten"


def test_tombstones_are_forgotten_after_a_while_without_a_relist():
    now = [0.0]
    store = Store(JOBS, clock=lambda: now[0])
    store.put(job("5", "Running"))
    store.remove(job("6", "Running"))
    now[0] = cache.TOMBSTONE_SECONDS - 1
    assert store.tombstones == 1 and not store.put(job("5", "Running")), "a late copy within the window stays out"
    now[0] = cache.TOMBSTONE_SECONDS + 1
    assert store.tombstones == 0


def test_pods_are_kept_as_views_by_job_in_name_order():
    store = Store(PODS)
    for name, owner in (("mlp-node-1", "mlp"), ("other-node-0", "other"), ("mlp-node-0", "mlp")):
        store.put(pod(name, owner))
    assert [p.name for p in store.of_job("ns", "mlp")] == ["mlp-node-0", "mlp-node-1"]
    store.remove(pod("mlp-node-0", version="9"))
    assert [p.name for p in store.of_job("ns", "mlp")] == ["mlp-node-1"]


def test_a_fresh_list_drops_what_was_deleted_meanwhile_and_names_the_jobs_it_changed():
    store = Store(PODS)
    for name, owner in (("a-0", "a"), ("b-0", "b"), ("c-0", "c")):
        store.put(pod(name, owner))
    store.put(pod("d-0", "d", namespace="elsewhere"))
    touched = store.replace("ns", [pod("a-0", "a"), pod("b-0", "b", version="2"), pod("e-0", "e")])
    assert touched == {("ns", "b"), ("ns", "c"), ("ns", "e")}  # changed, deleted, added; a is as it was
    assert [store.of_job("ns", j) != () for j in "abce"] == [True, True, False, True]
    assert store.of_job("elsewhere", "d"), "a namespace's list leaves the other namespaces alone"


# ---------------------------------------------------------------------------- watches


def connect(url: str) -> kube.Kube:
    return kube.Kube(kopf.ConnectionInfo(server=url, token="test"))


async def until(predicate, timeout=10.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)


def follow(cluster, k8s, scenario, kinds=(PODS, SERVICES)):
    """Runs ``scenario(cache, poked)`` with a started cache of ``kinds`` (pods and Services) in ``k8s.namespace``."""
    async def main():
        api, poked = connect(k8s.url), []
        cache = ClusterCache(api, [k8s.namespace], poke=poked.append, kinds=kinds)
        cache.start()
        try:
            await asyncio.wait_for(cache.synced(), 10)
            return await scenario(cache, poked)
        finally:
            await cache.stop()
            await api.close()
    return asyncio.run(main())


def test_a_pod_created_behind_the_caches_back_arrives_by_the_watch_and_pokes_its_job(cluster, k8s):
    k8s.create("pods", pod("before-0", "before", namespace=k8s.namespace))
    k8s.create("pods", pod("stranger", "x", namespace=k8s.namespace) | {"metadata": {"name": "stranger"}})

    async def scenario(cache, poked):
        assert [p.name for p in cache.pods(k8s.namespace, "before")] == ["before-0"]
        k8s.create("pods", pod("mlp-node-0", namespace=k8s.namespace))
        await until(lambda: cache.pods(k8s.namespace, "mlp"))
        k8s.delete("pods", "before-0")
        await until(lambda: not cache.pods(k8s.namespace, "before"))
        return poked
    poked = follow(cluster, k8s, scenario)
    assert (k8s.namespace, "mlp") in poked and poked.count((k8s.namespace, "before")) == 2  # listed, deleted
    counts = cluster.emulator.request_counts(AGENT, "pods")
    assert (counts["LIST"], counts["WATCH"], counts["GET"]) == (1, 1, 0), "one list, one watch, nothing per pass"


def test_an_expired_watch_lists_again_and_goes_on_watching(cluster, k8s):
    async def scenario(cache, poked):
        k8s.create("pods", pod("mlp-node-0", namespace=k8s.namespace))
        await until(lambda: cache.pods(k8s.namespace, "mlp"))
        cluster.emulator.expire("pods")  # 410 Gone: the events it would resume from are compacted
        await until(lambda: cluster.emulator.request_counts(AGENT, "pods")["LIST"] == 2)
        k8s.create("pods", pod("mlp-node-1", namespace=k8s.namespace))
        await until(lambda: len(cache.pods(k8s.namespace, "mlp")) == 2)
        return [p.name for p in cache.pods(k8s.namespace, "mlp")]
    assert follow(cluster, k8s, scenario) == ["mlp-node-0", "mlp-node-1"]
    counts = cluster.emulator.request_counts(AGENT, "pods")
    assert (counts["LIST"], counts["WATCH"]) == (2, 2)


def test_a_service_is_known_to_exist_once_its_watch_brings_it(cluster, k8s):
    service = {"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "mlp", "labels": {C.LABEL_MANAGED_BY: C.MANAGED_BY}}, "spec": {"clusterIP": "None"}}

    async def scenario(cache, poked):
        before = cache.exists(SERVICES, k8s.namespace, "mlp")
        k8s.create("services", service)
        await until(lambda: cache.exists(SERVICES, k8s.namespace, "mlp"))
        return before
    assert follow(cluster, k8s, scenario) is False


def budget(name, selector_values, labels=None, owner_uid=None):
    """A PodDisruptionBudget whose selector lists ``selector_values`` (many make it huge)."""
    meta = {"name": name, "labels": labels or {}, "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:x": {}}}]}
    if owner_uid:
        meta["ownerReferences"] = [{"apiVersion": C.API_VERSION, "kind": C.KIND, "name": name, "uid": owner_uid,
                                    "controller": True, "blockOwnerDeletion": True}]
    return {"apiVersion": C.POLICY_API_VERSION, "kind": "PodDisruptionBudget", "metadata": meta,
            "spec": {"minAvailable": 1, "selector": {"matchExpressions": [
                {"key": "app", "operator": "In", "values": selector_values}]}}}


def test_a_foreign_budget_is_never_listed_and_ours_keep_only_what_a_pass_compares(cluster, k8s):
    huge = [f"value-{i:06d}-" + "x" * 50 for i in range(10_000)]  # a ~640 KiB selector
    k8s.create("poddisruptionbudgets", budget("theirs", huge))
    k8s.create("poddisruptionbudgets", budget("mlp", ["a"], {C.LABEL_MANAGED_BY: C.MANAGED_BY}, "uid-1"))
    k8s.create("poddisruptionbudgets", budget("grown", huge, {C.LABEL_MANAGED_BY: C.MANAGED_BY}, "uid-2"))

    async def scenario(cache, poked):
        store = cache.stores[DISRUPTION_BUDGETS.plural]
        await until(lambda: cluster.emulator.request_counts(AGENT, "poddisruptionbudgets")["WATCH"] == 1)
        return len(store), [store.get(k8s.namespace, name) for name in ("theirs", "mlp", "grown")]
    held, (theirs, mlp, grown) = follow(cluster, k8s, scenario, kinds=(DISRUPTION_BUDGETS,))
    assert held == 2 and theirs is None, "a budget the operator did not make never reaches it"
    assert mlp == {"metadata": {"ownerReferences": [{"uid": "uid-1", "controller": True}]},
                   "spec": {"minAvailable": 1, "selector": {"matchExpressions": [
                       {"key": "app", "operator": "In", "values": ["a"]}]}}}
    assert grown["spec"]["selector"].startswith("<not kept: ") and len(str(grown)) < 300, \
        "ours, grown by someone who may edit budgets: marked (the pass patches it back), not held"
    asked = [(r.action, r.params.get("labelSelector")) for r in cluster.emulator._requests
             if r.resource is not None and r.resource.plural == "poddisruptionbudgets"
             and (r.headers.get("User-Agent") or "").startswith(C.MANAGED_BY)]
    ours = f"{C.LABEL_MANAGED_BY}={C.MANAGED_BY}"
    assert sorted(asked) == [("LIST", ours), ("WATCH", ours)], "the server filters: the list and the watch say what"


def test_a_cached_job_leaves_out_kubectls_copy_of_its_spec_and_the_field_owners():
    store = Store(JOBS)
    body = job("5", "Running")
    body["metadata"] |= {"managedFields": [{"manager": "kubectl"}], "uid": "u", "annotations": {
        "kubectl.kubernetes.io/last-applied-configuration": "{...the whole spec again...}", "team": "a"}}
    store.put(body)
    assert store.get("ns", "mlp")["metadata"] == {"name": "mlp", "namespace": "ns", "resourceVersion": "5",
                                                  "uid": "u", "annotations": {"team": "a"}}


def test_a_pod_is_held_with_only_the_ports_and_conditions_a_pass_reads():
    store = Store(PODS)
    body = pod("mlp-node-0")
    body["spec"]["containers"][0]["ports"] = [{"name": f"p{i}", "containerPort": 1000 + i} for i in range(5000)] + [
        {"name": C.PROGRESS_PORT_NAME, "containerPort": C.PROGRESS_PORT}]
    body["status"] = {"phase": "Running", "conditions": [
        {"type": f"example.com/gate-{i}", "status": "True", "message": "m" * 1000} for i in range(500)] + [
        {"type": "Ready", "status": "True"}]}
    store.put(body)
    [view] = store.of_job("ns", "mlp")
    assert dict(view.ports) == {C.PROGRESS_PORT_NAME: C.PROGRESS_PORT}
    assert list(view.conditions) == ["Ready"] and view.ready


def test_every_kind_but_the_jobs_is_listed_and_watched_with_the_operators_label_selector(cluster, k8s):
    async def scenario(cache, poked):
        await until(lambda: cluster.emulator.request_counts(AGENT)["WATCH"] == len(cache.stores))
    follow(cluster, k8s, scenario, kinds=cache.WATCHED)
    asked = {(r.resource.plural, r.action.value, r.params.get("labelSelector")) for r in cluster.emulator._requests
             if r.resource is not None and (r.headers.get("User-Agent") or "").startswith(C.MANAGED_BY)}
    ours = f"{C.LABEL_MANAGED_BY}={C.MANAGED_BY}"
    assert asked == {(kind.plural, verb, ours if kind is not cache.JOBS else None)
                     for kind in cache.WATCHED for verb in ("LIST", "WATCH")}
