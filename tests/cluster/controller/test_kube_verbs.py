"""kube.py's verbs against the real API server: idempotent creates and deletes, a 409 on
someone else's object refused by name, budgets read and patched, status written through the
status subresource, events naming the job. (The error sorting of a busy or refusing server and
the rate limit need no API server: tests/operator/controller/test_operator_kube.py.)"""
import asyncio

import pytest

from ddpjob_operator.controller.kube import ForeignObjectError
from ddpjob_sandbox.jobs import make_manifest

# The real scheduler would bind these pods to whatever Nodes the session registered, and a bound
# pod's delete waits for its kubelet: a scheduler no one runs leaves them unbound, deleted at once.
UNSCHEDULED = "ddpjob-test-no-scheduler"

pytestmark = pytest.mark.usefixtures("ddpjob_crd")


def pod(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"ddpjob.io/job-name": "mlp"}},
            "spec": {"schedulerName": UNSCHEDULED, "containers": [{"name": "trainer", "image": "trainer:1"}]}}


def run(connect, scenario):
    """Runs ``scenario(api)`` with a fresh client and closes the client."""
    async def with_client():
        api = connect()
        try:
            return await scenario(api)
        finally:
            await api.close()
    return asyncio.run(with_client())


def test_create_or_skip_creates_once_and_answers_the_stored_object_then_skips(kube, connect):
    async def scenario(api):
        return [await api.create_or_skip(pod("p0"), kube.namespace), await api.create_or_skip(pod("p0"), kube.namespace)]
    created, skipped = run(connect, scenario)
    [stored] = kube.list("pods")
    assert skipped is None and stored["metadata"]["name"] == "p0"
    assert (created["metadata"]["uid"], created["metadata"]["resourceVersion"]) == (
        stored["metadata"]["uid"], stored["metadata"]["resourceVersion"])


def owned(name: str, job: dict) -> dict:
    body = pod(name)
    body["metadata"]["ownerReferences"] = [{"apiVersion": "ddpjob.io/v1alpha1", "kind": "DDPJob",
                                            "name": job["metadata"]["name"], "uid": job["metadata"]["uid"],
                                            "controller": True}]
    return body


def test_a_409_on_an_object_the_job_controls_is_skipped_and_on_anyone_elses_is_refused_by_name(kube, connect):
    # Real owners: the garbage collector deletes a pod whose owner does not exist, mid-test.
    mlp = kube.create("ddpjobs", make_manifest())
    other = kube.create("ddpjobs", make_manifest(name="other"))
    kube.create("pods", owned("mlp-node-0", mlp))  # ours, from a pass before a restart
    kube.create("pods", pod("mlp-node-1"))  # someone's pod without an owner, bearing our name
    kube.create("pods", owned("mlp-node-2", other))  # another job's

    async def scenario(api):
        outcomes = [await api.create_or_skip(owned("mlp-node-0", mlp), kube.namespace)]
        for name in ("mlp-node-1", "mlp-node-2"):
            try:
                outcomes.append(await api.create_or_skip(owned(name, mlp), kube.namespace))
            except ForeignObjectError as e:
                outcomes.append((e.status, e.reason, e.api_message))
        return outcomes
    skipped, no_owner, theirs = run(connect, scenario)
    uid = mlp["metadata"]["uid"]
    assert skipped is None
    assert no_owner == (409, "ForeignObject", (
        f"Pod 'mlp-node-1' already exists and has no controller, not by DDPJob 'mlp' (uid {uid}): the operator "
        "neither adopts nor replaces it; delete or rename it so the job can create its own"))
    assert theirs[2].startswith(
        f"Pod 'mlp-node-2' already exists and is controlled by DDPJob 'other' (uid {other['metadata']['uid']})")


def test_delete_or_skip_skips_missing_pods_and_newer_pods_of_the_same_name(kube, connect):
    stale_uid = kube.create("pods", pod("p0"))["metadata"]["uid"]
    kube.delete("pods", "p0")
    kube.wait_for(lambda: kube.find("pods", "p0") is None, timeout=30, what="p0 deleted")
    kube.create("pods", pod("p0"))  # a replacement with a new uid

    async def scenario(api):
        return [await api.delete_or_skip("Pod", kube.namespace, "p0", stale_uid),
                await api.delete_or_skip("Pod", kube.namespace, "ghost")]
    assert run(connect, scenario) == [False, False]
    assert kube.find("pods", "p0") is not None, "the newer pod must survive a delete aimed at the old uid"


def test_a_budget_is_read_patched_and_a_missing_one_is_none_or_skipped(kube, connect):
    budget = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "mlp"},
              "spec": {"minAvailable": 1, "selector": {"matchLabels": {"ddpjob.io/job-name": "mlp"}}}}

    async def scenario(api):
        missing = await api.get_or_none("PodDisruptionBudget", kube.namespace, "mlp")
        skipped = await api.patch_or_skip("PodDisruptionBudget", kube.namespace, "mlp", {"spec": {"minAvailable": 2}})
        await api.create_or_skip(budget, kube.namespace)
        patched = await api.patch_or_skip("PodDisruptionBudget", kube.namespace, "mlp", {"spec": {"minAvailable": 3}})
        read = await api.get_or_none("PodDisruptionBudget", kube.namespace, "mlp")
        return missing, skipped, patched, read["spec"]
    assert run(connect, scenario) == (None, False, True, {**budget["spec"], "minAvailable": 3})


def test_status_patch_writes_only_the_status_and_skips_a_deleted_job(kube, connect):
    kube.create("ddpjobs", make_manifest())

    async def scenario(api):
        patched = await api.patch_job_status(kube.namespace, "mlp", {"phase": "Running", "restarts": 0})
        missing = await api.patch_job_status(kube.namespace, "ghost", {"phase": "Running"})
        return patched, missing
    patched, missing = run(connect, scenario)
    assert patched["status"] == {"phase": "Running", "restarts": 0} and missing is None
    assert kube.get("ddpjobs", "mlp")["metadata"]["generation"] == 1


def test_events_name_the_job_and_the_operator(kube, connect):
    job = kube.create("ddpjobs", make_manifest())

    async def scenario(api):
        await api.post_event(job, "Warning", "NodeFailed", "node pod mlp-node-1 failed (exit code 1)")
    run(connect, scenario)
    [event] = kube.list("events")
    assert event["involvedObject"]["uid"] == job["metadata"]["uid"]
    assert (event["type"], event["reason"], event["source"]["component"]) == ("Warning", "NodeFailed",
                                                                                "ddpjob-operator")
