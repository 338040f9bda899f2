"""The operator's cache (controller/cache.py): a store that keeps the newest copy of each object,
re-lists honestly and holds only what a pass reads. The watches that feed it, on the real API
server (410 Gone included): tests/cluster/controller/test_cache_watches.py."""
from ddpjob_operator.api import constants as C
from ddpjob_operator.controller import cache
from ddpjob_operator.controller.cache import JOBS, PODS, Store


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
