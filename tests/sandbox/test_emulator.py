"""The test-side Kubernetes API emulator follows the API conventions the operator relies on.

Each test drives the emulator over HTTP (urllib) or with kubectl, as a client of a real API
server would, and pins one convention from ddpjob_sandbox.emulator.
"""
import json
import threading
import time
import urllib.request

import pytest

from ddpjob_sandbox.client import ApiError
from ddpjob_sandbox.emulator import Refusal, quota_refusal


def job(name="mlp", replicas=2, **metadata):
    return {"apiVersion": "ddpjob.io/v1alpha1", "kind": "DDPJob",
            "metadata": {"name": name, **metadata}, "spec": {"replicas": replicas, "image": "trainer:1"}}


def pod(name, labels=None, **metadata):
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels or {}, **metadata},
            "spec": {"containers": [{"name": "trainer", "image": "trainer:1"}]}}


class Watch:
    """Reads a watch stream in a thread until the server closes it after ``timeoutSeconds``."""

    def __init__(self, k8s, resource, seconds=1.5, **params):
        query = "&".join(f"{k}={v}" for k, v in {"watch": "true", "timeoutSeconds": seconds, **params}.items())
        self.url = f"{k8s.url}{k8s.path(resource)}?{query}"
        self.events = []
        self.opened = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()
        assert self.opened.wait(5), "the watch stream did not open"

    def _read(self):
        with urllib.request.urlopen(self.url, timeout=30) as response:
            self.opened.set()
            for line in response:
                if line.strip():
                    self.events.append(json.loads(line))

    def result(self):
        self.thread.join(timeout=30)
        return [(e["type"], e["object"]["metadata"]["name"]) for e in self.events]


def test_create_fills_uid_resource_version_timestamp_and_generation(k8s):
    created = k8s.create("ddpjobs", job())
    meta = created["metadata"]
    assert len(meta["uid"]) == 36 and meta["namespace"] == k8s.namespace
    assert meta["generation"] == 1
    assert meta["creationTimestamp"].endswith("Z")
    second = k8s.create("ddpjobs", job("other"))
    assert int(second["metadata"]["resourceVersion"]) > int(meta["resourceVersion"])
    assert second["metadata"]["uid"] != meta["uid"]


def test_generate_name_appends_five_random_characters(k8s):
    first = k8s.create("events", {"metadata": {"generateName": "mlp."}, "reason": "Created"})
    second = k8s.create("events", {"metadata": {"generateName": "mlp."}, "reason": "Created"})
    assert first["metadata"]["name"].startswith("mlp.") and len(first["metadata"]["name"]) == len("mlp.") + 5
    assert first["metadata"]["name"] != second["metadata"]["name"]


def test_create_without_name_or_generate_name_is_invalid(k8s):
    with pytest.raises(ApiError) as error:
        k8s.create("pods", {"metadata": {}})
    assert error.value.status == 422


def test_duplicate_create_is_409_already_exists(k8s):
    k8s.create("pods", pod("p0"))
    with pytest.raises(ApiError) as error:
        k8s.create("pods", pod("p0"))
    assert (error.value.status, error.value.body["reason"]) == (409, "AlreadyExists")


def test_refused_creates_answer_as_admission_would_and_every_create_is_counted(cluster, k8s):
    cluster.emulator.refuse_creates("pods", k8s.namespace, quota_refusal("gpu-quota", used=2, limit=2))
    with pytest.raises(ApiError) as error:
        k8s.create("pods", pod("p0"))
    assert (error.value.status, error.value.body["reason"], error.value.body["message"]) == (
        403, "Forbidden", 'pods "p0" is forbidden: exceeded quota: gpu-quota, requested: pods=1, used: pods=2, '
                          "limited: pods=2")
    k8s.create("services", {"metadata": {"name": "s0"}})  # other kinds are not refused
    cluster.emulator.refuse_creates("pods", k8s.namespace, Refusal(429, "TooManyRequests", "slow down", retry_after=7))
    with pytest.raises(ApiError) as error:
        k8s.create("pods", pod("p0"))
    assert (error.value.status, error.value.body["details"]["retryAfterSeconds"]) == (429, 7)
    cluster.emulator.allow_creates("pods", k8s.namespace)
    k8s.create("pods", pod("p0"))
    assert cluster.emulator.create_attempts[("pods", k8s.namespace)] == 3
    assert k8s.find("pods", "p0") is not None


def test_create_after_delete_reuses_the_name_with_a_new_uid(k8s):
    first = k8s.create("pods", pod("p0"))
    k8s.delete("pods", "p0")
    second = k8s.create("pods", pod("p0"))
    assert second["metadata"]["uid"] != first["metadata"]["uid"]


def test_stale_resource_version_in_patch_and_put_is_409_conflict(k8s):
    created = k8s.create("ddpjobs", job())
    stale = created["metadata"]["resourceVersion"]
    k8s.patch("ddpjobs", "mlp", {"spec": {"replicas": 3}})
    with pytest.raises(ApiError) as error:
        k8s.patch("ddpjobs", "mlp", {"metadata": {"resourceVersion": stale}, "spec": {"replicas": 4}})
    assert (error.value.status, error.value.body["reason"]) == (409, "Conflict")
    with pytest.raises(ApiError) as error:
        k8s.replace("ddpjobs", "mlp", created)
    assert error.value.status == 409
    assert k8s.get("ddpjobs", "mlp")["spec"]["replicas"] == 3


def test_put_with_the_current_resource_version_replaces_the_object(k8s):
    k8s.create("ddpjobs", job())
    current = k8s.get("ddpjobs", "mlp")
    current["spec"] = {"replicas": 5}
    replaced = k8s.replace("ddpjobs", "mlp", current)
    assert replaced["spec"] == {"replicas": 5}
    assert replaced["metadata"]["generation"] == 2


def test_generation_bumps_on_spec_change_not_on_status_or_metadata(k8s):
    k8s.create("ddpjobs", job())
    status_write = k8s.patch("ddpjobs", "mlp", {"status": {"phase": "Running"}}, subresource="status")
    assert status_write["metadata"]["generation"] == 1
    assert k8s.patch("ddpjobs", "mlp", {"metadata": {"labels": {"a": "b"}}})["metadata"]["generation"] == 1
    assert k8s.patch("ddpjobs", "mlp", {"spec": {"replicas": 3}})["metadata"]["generation"] == 2


def test_a_no_op_patch_keeps_the_resource_version(k8s):
    created = k8s.create("ddpjobs", job())
    patched = k8s.patch("ddpjobs", "mlp", {"spec": {"replicas": 2}})
    assert patched["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]


def test_status_subresource_separates_status_writes_from_the_rest(k8s):
    k8s.create("ddpjobs", {**job(), "status": {"phase": "Forged"}})
    assert "status" not in k8s.get("ddpjobs", "mlp")  # status is dropped on create
    k8s.patch("ddpjobs", "mlp", {"spec": {"replicas": 9}, "status": {"phase": "Running"}}, subresource="status")
    k8s.patch("ddpjobs", "mlp", {"status": {"phase": "Failed"}})
    stored = k8s.get("ddpjobs", "mlp")
    assert stored["status"] == {"phase": "Running"}
    assert stored["spec"]["replicas"] == 2


def test_json_patch_applies_ops_and_a_failed_test_op_is_422(k8s):
    created = k8s.create("pods", pod("p0", finalizers=["x/y"]))
    version = created["metadata"]["resourceVersion"]
    ops = [{"op": "test", "path": "/metadata/resourceVersion", "value": version},
           {"op": "remove", "path": "/metadata/finalizers/0"},
           {"op": "add", "path": "/metadata/labels/role", "value": "node"}]
    patched = k8s.patch("pods", "p0", ops, patch_type="json")
    assert patched["metadata"]["finalizers"] == [] and patched["metadata"]["labels"] == {"role": "node"}
    with pytest.raises(ApiError) as error:
        stale_ops = ops[:1] + [{"op": "add", "path": "/metadata/labels/x", "value": "1"}]
        k8s.patch("pods", "p0", stale_ops, patch_type="json")
    assert error.value.status == 422


def test_merge_patch_null_removes_a_key_and_lists_are_replaced(k8s):
    k8s.create("pods", pod("p0", labels={"a": "1", "b": "2"}, finalizers=["x/1", "x/2"]))
    patched = k8s.patch("pods", "p0", {"metadata": {"labels": {"a": None}, "finalizers": ["x/3"]}})
    assert patched["metadata"]["labels"] == {"b": "2"}
    assert patched["metadata"]["finalizers"] == ["x/3"]


@pytest.mark.parametrize("selector, expected", [
    ("app=ddpjob", ["a0", "a1", "b0"]),
    ("app==ddpjob,job=a", ["a0", "a1"]),
    ("job!=a", ["b0", "other"]),
    ("job in (a, b),index", ["a0", "a1", "b0"]),
    ("job notin (a),app", ["b0", "other"]),  # notin also matches where the key is absent
    ("!job", ["other"]),
    ("index=1", ["a1"]),
])
def test_list_filters_by_label_selector(k8s, selector, expected):
    for name, labels in {"a0": {"app": "ddpjob", "job": "a", "index": "0"},
                         "a1": {"app": "ddpjob", "job": "a", "index": "1"},
                         "b0": {"app": "ddpjob", "job": "b", "index": "0"},
                         "other": {"app": "web"}}.items():
        k8s.create("pods", pod(name, labels))
    assert sorted(p["metadata"]["name"] for p in k8s.list("pods", label_selector=selector)) == expected


def test_list_filters_by_namespace_and_field_selector(k8s):
    k8s.create("pods", pod("p0"))
    k8s.create("pods", pod("p1"))
    k8s.create("pods", pod("p0"), namespace="elsewhere")
    assert [p["metadata"]["name"] for p in k8s.list("pods", field_selector="metadata.name=p1")] == ["p1"]
    assert len(k8s.list("pods")) == 2
    assert len(k8s.list("pods", namespace="elsewhere")) == 1


def test_list_carries_the_current_resource_version(k8s):
    created = k8s.create("pods", pod("p0"))
    listed = k8s.request("GET", k8s.path("pods"))
    assert listed["kind"] == "PodList"
    assert int(listed["metadata"]["resourceVersion"]) >= int(created["metadata"]["resourceVersion"])


def test_watch_streams_added_modified_deleted_for_matching_labels(k8s):
    k8s.create("pods", pod("before", {"job": "a"}))
    watch = Watch(k8s, "pods", labelSelector="job=a")
    k8s.create("pods", pod("p0", {"job": "a"}))
    k8s.create("pods", pod("ignored", {"job": "b"}))
    k8s.patch("pods", "p0", {"status": {"phase": "Running"}}, subresource="status")
    k8s.delete("pods", "p0")
    assert watch.result() == [("ADDED", "before"), ("ADDED", "p0"), ("MODIFIED", "p0"), ("DELETED", "p0")]


def test_watch_from_a_resource_version_replays_only_later_events(k8s):
    k8s.create("pods", pod("old"))
    version = k8s.request("GET", k8s.path("pods"))["metadata"]["resourceVersion"]
    k8s.create("pods", pod("new"))
    k8s.delete("pods", "old")
    watch = Watch(k8s, "pods", seconds=0.5, resourceVersion=version)
    assert watch.result() == [("ADDED", "new"), ("DELETED", "old")]


def test_delete_with_finalizers_marks_and_removing_them_deletes(k8s):
    k8s.create("ddpjobs", job(finalizers=["kopf.zalando.org/KopfFinalizerMarker"]))
    marked = k8s.delete("ddpjobs", "mlp")
    assert marked["metadata"]["deletionTimestamp"]
    assert k8s.get("ddpjobs", "mlp")["metadata"]["deletionTimestamp"] == marked["metadata"]["deletionTimestamp"]
    k8s.patch("ddpjobs", "mlp", {"metadata": {"finalizers": []}})
    assert k8s.find("ddpjobs", "mlp") is None


def test_delete_of_a_missing_object_is_404(k8s):
    with pytest.raises(ApiError) as error:
        k8s.delete("pods", "ghost")
    assert (error.value.status, error.value.body["reason"]) == (404, "NotFound")


def test_deleting_an_owner_deletes_its_dependents_in_the_background(k8s):
    owner = k8s.create("ddpjobs", job())
    reference = {"apiVersion": "ddpjob.io/v1alpha1", "kind": "DDPJob", "name": "mlp",
                 "uid": owner["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}
    k8s.create("pods", pod("mlp-node-0", ownerReferences=[reference]))
    k8s.create("services", {"metadata": {"name": "mlp", "ownerReferences": [reference]}, "spec": {"clusterIP": "None"}})
    k8s.create("pods", pod("unrelated"))
    k8s.delete("ddpjobs", "mlp")
    def remaining():
        return [p["metadata"]["name"] for p in k8s.list("pods")]

    k8s.wait_for(lambda: not k8s.list("services") and remaining() == ["unrelated"],
                 timeout=5, what="the job's pod and service to be garbage-collected")


def test_orphan_propagation_keeps_dependents(k8s):
    owner = k8s.create("ddpjobs", job())
    k8s.create("pods", pod("p0", ownerReferences=[{"uid": owner["metadata"]["uid"], "kind": "DDPJob", "name": "mlp",
                                                   "apiVersion": "ddpjob.io/v1alpha1"}]))
    k8s.delete("ddpjobs", "mlp", propagationPolicy="Orphan")
    time.sleep(0.3)
    assert k8s.find("pods", "p0") is not None


def test_namespaces_are_listed_including_implicitly_created_ones(k8s):
    k8s.create("pods", pod("p0"))
    names = {ns["metadata"]["name"] for ns in k8s.list("namespaces")}
    assert {"default", k8s.namespace} <= names
    assert k8s.get("namespaces", k8s.namespace)["kind"] == "Namespace"
    assert k8s.namespace in k8s.kubectl("get", "namespaces", "-o", "name").stdout


def test_scale_subresource_maps_onto_spec_and_status_replicas(k8s):
    k8s.create("ddpjobs", job(replicas=2))
    k8s.patch("ddpjobs", "mlp", {"status": {"replicas": 2, "selector": "ddpjob.io/job-name=mlp"}}, subresource="status")
    scale = k8s.get("ddpjobs", "mlp", subresource="scale")
    assert (scale["kind"], scale["spec"], scale["status"]) == (
        "Scale", {"replicas": 2}, {"replicas": 2, "selector": "ddpjob.io/job-name=mlp"})
    scaled = k8s.patch("ddpjobs", "mlp", {"spec": {"replicas": 4}}, subresource="scale")
    assert scaled["spec"]["replicas"] == 4
    assert k8s.get("ddpjobs", "mlp")["spec"]["replicas"] == 4
    with pytest.raises(ApiError) as error:
        k8s.patch("ddpjobs", "mlp", {"spec": {"replicas": -1}}, subresource="scale")
    assert error.value.status == 422


def test_kubectl_scale_uses_the_scale_subresource(k8s):
    k8s.create("ddpjobs", job(replicas=2))
    k8s.kubectl("scale", "ddpjob/mlp", "--replicas=3")
    assert k8s.get("ddpjobs", "mlp")["spec"]["replicas"] == 3


def test_events_are_accepted_in_core_v1_and_events_k8s_io(k8s):
    k8s.create("events", {"metadata": {"generateName": "mlp."}, "reason": "Created", "message": "m",
                          "involvedObject": {"kind": "DDPJob", "name": "mlp"}, "type": "Normal"})
    k8s.create("events.k8s.io", {"metadata": {"generateName": "mlp."}, "reason": "Created", "note": "m",
                                 "regarding": {"kind": "DDPJob", "name": "mlp"}, "type": "Normal"})
    assert [e["reason"] for e in k8s.list("events")] == ["Created"]
    assert [e["reason"] for e in k8s.list("events.k8s.io")] == ["Created"]


def test_kubectl_apply_get_and_patch_work_against_the_emulator(k8s, tmp_path):
    manifest = tmp_path / "job.yaml"
    manifest.write_text(json.dumps(job("applied", replicas=2)))
    assert "created" in k8s.kubectl("apply", "--validate=false", "-f", str(manifest)).stdout
    manifest.write_text(json.dumps(job("applied", replicas=3)))
    assert "configured" in k8s.kubectl("apply", "--validate=false", "-f", str(manifest)).stdout
    assert k8s.get("ddpjobs", "applied")["spec"]["replicas"] == 3
    k8s.kubectl("patch", "ddpjob", "applied", "--type=merge", "-p", '{"spec": {"replicas": 1}}')
    listed = k8s.kubectl("get", "ddpj", "-o", "json").stdout
    assert [item["spec"]["replicas"] for item in json.loads(listed)["items"]] == [1]


def test_watch_from_a_resource_version_older_than_the_log_is_410_gone(k8s, monkeypatch):
    from ddpjob_sandbox.emulator import server

    monkeypatch.setattr(server, "WATCH_LOG_SIZE", 3)  # read when the pods' log is first made
    first = k8s.create("pods", pod("p0"))["metadata"]["resourceVersion"]
    for i in range(1, 5):
        k8s.create("pods", pod(f"p{i}"))
    watch = Watch(k8s, "pods", seconds=0.5, resourceVersion=first)
    watch.thread.join(timeout=30)
    assert [(e["type"], e["object"].get("code")) for e in watch.events] == [("ERROR", 410)]


def test_requests_are_counted_by_client_and_verb_as_the_audit_log_names_them(cluster, k8s):
    created = k8s.create("pods", pod("p0"))
    k8s.get("pods", "p0")
    k8s.list("pods")
    k8s.list("pods", label_selector="a=b")
    k8s.patch("pods", "p0", {"metadata": {"labels": {"a": "b"}}})
    Watch(k8s, "pods", seconds=0.1, resourceVersion=created["metadata"]["resourceVersion"]).result()
    k8s.delete("pods", "p0")
    counts = cluster.emulator.request_counts(("Python-urllib",), "pods")
    assert {verb: counts[verb] for verb in ("POST", "GET", "LIST", "PATCH", "WATCH", "DELETE")} == {
        "POST": 1, "GET": 1, "LIST": 2, "PATCH": 1, "WATCH": 1, "DELETE": 1}
    assert cluster.emulator.request_counts(("kubectl",))["LIST"] == 0, "only the named clients' requests"


def test_an_expired_watch_ends_with_410_gone_and_cannot_resume_from_before_it(cluster, k8s):
    since = k8s.create("pods", pod("p0"))["metadata"]["resourceVersion"]
    watch = Watch(k8s, "pods", seconds=5, resourceVersion=since)
    k8s.create("pods", pod("p1"))
    cluster.emulator.expire("pods")
    watch.thread.join(timeout=10)
    assert [(e["type"], e["object"].get("code")) for e in watch.events] == [("ADDED", None), ("ERROR", 410)]
    late = Watch(k8s, "pods", seconds=0.5, resourceVersion=since)
    late.thread.join(timeout=10)
    assert [(e["type"], e["object"]["code"], e["object"]["reason"]) for e in late.events] == [("ERROR", 410, "Expired")]
