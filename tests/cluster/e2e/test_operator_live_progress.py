"""A running job's progress, read by the helm-installed operator from its node pods' progress
endpoints (controller/live_progress.py), on the real control plane.

Without it the operator learns where training stands only when a container exits; these prove
that the status follows a job that never fails, from one node that answers, and that a malformed
record, there or in a termination message, cannot stop a pass. The node pod sits on a status-only
Node: the test reports it running at a fake pod's loopback address (its podIP), where a FakePod
answers on the progress port every rendered pod names (C.PROGRESS_PORT; the API server lets no one
change a pod's ports, and the sandbox's trainers bind their own pod address, not every
interface). Hostile endpoints, the URL order and the pod views need no API
server: tests/operator/controller/test_live_progress*.py."""
import json

import pytest

from ddpjob_operator.api import constants as C
from ddpjob_operator.api.clock import parse_time
from ddpjob_sandbox.pod_status import progress_message
from ddpjob_sandbox.readers import events, pod_names, status
from ddpjob_sandbox.scripted import set_running, set_terminated
from tests.cluster.operators import status_manifest
from tests.support.fake_pods import FakePod, record_answer

pytestmark = pytest.mark.cluster


def at_step(step, time):
    return record_answer(progress_message(step, snapshot_time=time))


def start_at(operator, fake) -> str:
    """Creates a one-node job, reports its pod running at ``fake``'s address; returns the pod's uid."""
    kube, job = operator.kube, operator.job
    kube.create("ddpjobs", status_manifest(job, replicas=1))
    node = f"{job}-node-0"
    kube.wait_for(lambda: pod_names(kube, job) == [node], timeout=20, what="the node pod")
    set_running(kube, node)
    kube.patch("pods", node, {"status": {"podIP": fake.ip, "podIPs": [{"ip": fake.ip}]}}, subresource="status")
    return kube.get("pods", node)["metadata"]["uid"]


@pytest.mark.operator_args("--progress-poll-seconds", "0.5", "--status-write-interval-seconds", "2")
def test_a_running_job_that_never_fails_shows_each_new_snapshot(operator):
    # A new snapshot is routine progress: written within one --status-write-interval-seconds.
    kube, job = operator.kube, operator.job
    with FakePod(at_step(40, "2026-11-23T01:00:40Z"), port=C.PROGRESS_PORT) as fake:
        start_at(operator, fake)
        kube.wait_for(lambda: (status(kube, job).get("lastSnapshot") or {}).get("step") == 40, timeout=20,
                      what="lastSnapshot from the endpoint")
        fake.answer = at_step(80, "2026-11-23T01:01:20Z")  # no pod event: only the poll can see this
        kube.wait_for(lambda: (status(kube, job).get("lastSnapshot") or {}).get("step") == 80, timeout=20,
                      what="the next snapshot, polled")
        assert status(kube, job)["lastSnapshot"]["time"] == "2026-11-23T01:01:20Z"


def invalid_record_events(kube, job):
    return [message for kind, reason, message in events(kube, job)
            if (kind, reason) == (C.EVENT_WARNING, C.REASON_INVALID_PROGRESS_RECORD)]


@pytest.mark.operator_args("--progress-poll-seconds", "0.3")
def test_malformed_records_at_the_endpoint_and_in_a_termination_message_cannot_stop_a_pass(operator):
    """Before the contract, either record made every pass raise: no status, no replacement."""
    kube, job = operator.kube, operator.job
    node = f"{job}-node-0"
    record = json.loads(progress_message(40))
    bad_step = json.dumps({**record, "snapshot": {**record["snapshot"], "step": "40a"}})
    bad_time = json.dumps({**record, "resume": {**record["resume"], "time": "yesterday"}})
    with FakePod(record_answer(bad_step), port=C.PROGRESS_PORT) as fake:
        first_uid = start_at(operator, fake)
        kube.wait_for(lambda: invalid_record_events(kube, job), timeout=20,
                      what="the Warning about the endpoint's record")
        kube.wait_for(lambda: status(kube, job).get("phase") == C.PHASE_RUNNING, timeout=20,
                      what="the pass writing the status")
        polls = len(fake.exchanges)
        kube.wait_for(lambda: len(fake.exchanges) >= polls + 3, timeout=20, what="three more polls")
        assert invalid_record_events(kube, job) == [
            f'node pod {node}: ignored the progress record in its progress endpoint: snapshot.step ("40a") '
            "must be an integer from 0 to 9007199254740991"], "reported once, not every poll"
        [listed] = status(kube, job)["invalidProgressRecords"]
        assert listed == {"pod": node, "podUID": first_uid, "field": "snapshot.step", "time": listed["time"]}
        assert parse_time(listed["time"]) is not None, "when it was reported: the endpoint's one a minute"

        set_terminated(kube, node, 1, message=bad_time)
        kube.wait_for(lambda: len(invalid_record_events(kube, job)) == 2, timeout=20,
                      what="the Warning about the termination message")
        assert invalid_record_events(kube, job)[1] == (
            f'node pod {node}: ignored the progress record in its termination message: resume.time ("yesterday") '
            "must be an RFC 3339 time such as 2026-01-02T03:04:05Z")
        kube.wait_for(lambda: status(kube, job).get("restarts") == 1, timeout=20, what="the failure counted")
        kube.wait_for(lambda: (kube.find("pods", node) or {}).get("metadata", {}).get("uid")
                      not in (None, first_uid), timeout=30, what="a replacement pod")
