"""One pass executes what decide/ returned and nothing of its own (controller/job_pass.py): the
progress poll comes back as the pass's requeue, a finished etcd-v3 job's keys are handed to the
cleaner (not dialled in the pass), every Event goes through the one poster, and routine progress
is kept between status writes (decide/writes.py). A fake cache and API stand in for the cluster."""
from __future__ import annotations

import asyncio

from ddpjob_operator.api import constants as C
from ddpjob_operator.controller.cache import ClusterCache
from ddpjob_operator.controller.job_pass import run_pass
from ddpjob_operator.controller.state import PassContext, PassSettings
from ddpjob_operator.decide.actions import DeleteRendezvousKeys
from ddpjob_operator.decide.observed import view_pods
from ddpjob_sandbox.jobs import make_ddpjob
from tests.operator.builders import make_pod

V3 = {"rdzvBackend": "etcd-v3", "rdzvEndpoints": ["10.0.0.1:2379"], "rdzvStore": "node"}


class Cache:
    """The cache as a pass reads it: one job, its pods, every Service, policy and budget present."""

    def __init__(self, job: dict, pods: list[dict]):
        self.held, self.pod_views = job, view_pods(pods)

    async def synced(self):
        return None

    def job(self, namespace, name):
        return self.held

    def pods(self, namespace, job):
        return self.pod_views

    def exists(self, kind, namespace, name):
        return True

    def get(self, kind, namespace, name):
        return None

    def refusal(self, kind, namespace):
        return None

    def offer(self, body):
        self.held = body


class Api:
    """Records status patches, writes and Events."""

    def __init__(self):
        self.events, self.writes = [], []

    async def patch_job_status(self, namespace, name, patch):
        return None

    async def create_or_skip(self, body, namespace):
        self.writes.append(body["kind"])

    async def delete_or_skip(self, *args, **kwargs):
        self.writes.append("delete")

    async def post_event(self, job, event_type, reason, message):
        self.events.append(reason)


class Cleaner:
    def __init__(self):
        self.started = []

    def start(self, job, keys):
        self.started.append(keys)


def a_pass(job: dict, pods: list[dict], poll: float = 30.0):
    api, cleaner = Api(), Cleaner()
    ctx = PassContext(api, Cache(job, pods), cleaner, PassSettings(progress_poll=poll))
    outcome = asyncio.run(run_pass(ctx, ("default", "mlp")))
    return outcome, api, cleaner


def test_a_running_job_is_passed_again_at_the_poll_period():
    job = make_ddpjob(replicas=2, elasticPolicy={"rdzvStore": "node"}, status={"phase": C.PHASE_RUNNING})
    pods = [make_pod(job, i) for i in range(2)]

    assert a_pass(job, pods)[0].requeue == 30.0
    assert a_pass(job, pods, poll=0.0)[0].requeue is None


def test_a_finished_etcd_v3_jobs_keys_go_to_the_cleaner_and_its_events_through_the_poster():
    job = make_ddpjob(replicas=2, elasticPolicy=V3, status={"phase": C.PHASE_RUNNING})
    pods = [make_pod(job, i, phase="Succeeded") for i in range(2)]

    outcome, api, cleaner = a_pass(job, pods)

    assert [type(k) for k in cleaner.started] == [DeleteRendezvousKeys]
    assert cleaner.started[0].run_ids == ("uid-mlp",)
    assert C.REASON_SUCCEEDED in api.events
    assert outcome.requeue is None  # finished: no progress to poll


class StatusApi(Api):
    """Applies status patches to the job, as the API server answers them."""

    def __init__(self, job: dict):
        super().__init__()
        self.job, self.patches = job, []

    async def patch_job_status(self, namespace, name, patch):
        self.patches.append(patch)
        self.job = {**self.job, "status": _merged(self.job.get("status") or {}, patch)}
        return self.job


def _merged(old: dict, patch: dict) -> dict:
    """``patch`` applied to ``old`` as RFC 7386 says (null removes)."""
    out = dict(old)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value)
        else:
            out[key] = value
    return out


def test_routine_progress_is_kept_between_writes_and_written_once_the_interval_is_over(monkeypatch):
    from ddpjob_operator.controller import live_progress
    from ddpjob_operator.controller.memory import StatusMemory
    from tests.operator.decide.test_hang import record

    job = make_ddpjob(replicas=3, elasticPolicy={"rdzvStore": "node"}, status={"phase": C.PHASE_RUNNING})
    pods = [make_pod(job, i) for i in range(3)]
    step = [40]

    async def live(pods, deadline=None):
        return [record(step[0])]

    monkeypatch.setattr(live_progress, "read_live_progress", live)
    clock = [0.0]
    api = StatusApi(job)
    cache = Cache(job, pods)
    ctx = PassContext(api, cache, Cleaner(), PassSettings(progress_poll=30.0, status_write_interval=600.0),
                      statuses=StatusMemory(clock=lambda: clock[0]))

    def a_poll(at: float, to_step: int):
        clock[0], step[0] = at, to_step
        asyncio.run(run_pass(ctx, ("default", "mlp")))
        return len(api.patches)

    assert a_poll(0, 40) == 1  # the first pass: counts, conditions, the first progress (news)
    assert [a_poll(t, 40 + t // 30) for t in (30, 60, 570)] == [1, 1, 1], "the step moved: kept, not written"
    assert ctx.statuses.jobs[("default", "mlp")].kept["progress"]["step"] == 59
    assert cache.held["status"]["progress"]["step"] == 40
    assert a_poll(600, 60) == 2 and api.patches[-1]["progress"]["step"] == 60, "the interval is over: one write"
    assert a_poll(630, 61) == 2

    ctx.settings = PassSettings(progress_poll=30.0, status_write_interval=0.0)
    assert a_poll(660, 62) == 3, "interval 0: every change, as before"


def test_one_pass_parses_the_spec_once(monkeypatch):
    """The spec is parsed once per pass and handed on (validation included), not re-read by each
    step; a counter on the one parse entry point, pydantic's model_validate, proves it."""
    from ddpjob_operator.api.spec import DDPJobSpec

    parse, parses = DDPJobSpec.model_validate.__func__, []

    def counted(cls, *args, **kwargs):
        parses.append(1)
        return parse(cls, *args, **kwargs)

    monkeypatch.setattr(DDPJobSpec, "model_validate", classmethod(counted))
    for job in (make_ddpjob(replicas=2, elasticPolicy={"rdzvStore": "node"}, status={"phase": C.PHASE_RUNNING}),
                make_ddpjob(replicas=2, elasticPolicy=V3, status={"phase": C.PHASE_RUNNING})):
        for phase in ("Running", "Succeeded"):  # a training pass, and a finishing one (keys planned too)
            pods = [make_pod(job, i, phase=phase) for i in range(2)]  # the builder parses: before counting
            parses.clear()
            a_pass(job, pods)
            assert len(parses) == 1, f"{len(parses)} parses in one {phase} pass"


class CreatingApi(StatusApi):
    """Answers each create with the object as a server stores it (a uid and a resourceVersion)."""

    def __init__(self, job: dict):
        super().__init__(job)
        self.version = 100

    async def create_or_skip(self, body, namespace):
        self.writes.append(f"{body['kind']}/{body['metadata']['name']}")
        self.version += 1
        return {**body, "metadata": {**body["metadata"], "namespace": namespace, "uid": f"uid-{self.version}",
                                     "resourceVersion": str(self.version)}}


def test_what_a_pass_created_is_in_the_cache_at_once_and_the_next_pass_creates_nothing_again():
    """A pass that comes before the watch's events (a busy operator's came within 0.2 s of its
    creates) reads the creates' answers from the cache: without them it planned every unseen pod
    again, a create refused with 409 and a read back each."""
    job = make_ddpjob(replicas=3, elasticPolicy={"rdzvStore": "node"})
    api = CreatingApi(job)
    cache = ClusterCache(api)  # no watch runs: nothing reaches it but the pass's own answers
    for synced in cache._synced.values():
        synced.set()
    cache.offer(job)
    ctx = PassContext(api, cache, Cleaner(), PassSettings(progress_poll=30.0))

    asyncio.run(run_pass(ctx, ("default", "mlp")))
    first = list(api.writes)
    assert [w for w in first if w.startswith("Pod/")] == [f"Pod/mlp-node-{i}" for i in range(3)]
    assert [p.name for p in cache.pods("default", "mlp")] == [f"mlp-node-{i}" for i in range(3)]
    asyncio.run(run_pass(ctx, ("default", "mlp")))
    assert api.writes == first, "the second pass created again"
