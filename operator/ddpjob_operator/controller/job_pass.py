"""One reconciliation pass over one job: observe, decide, apply.

A pass reads what decide/observation.py asks for (observe.py), hands it to the pure
decide.reconcile (status, Events, actions: every requeue included), and carries the result
out (apply.py: status, then actions, then Events). A status that differs from the stored one
in routine progress only is kept in memory instead, and written at most once per
--status-write-interval-seconds (decide/writes.py, memory.StatusMemory). A DeleteRendezvousKeys action is started
here, not awaited: the user's etcd must not hold the pass's concurrency slot (etcd_cleanup.py).
"""
from __future__ import annotations

import datetime

from ddpjob_operator.api.names import network_policy_name
from ddpjob_operator.controller import apply, metrics
from ddpjob_operator.controller.events import post_events
from ddpjob_operator.controller.observe import observe
from ddpjob_operator.controller.passes import JobKey, PassOutcome
from ddpjob_operator.controller.state import PassContext
from ddpjob_operator.decide.actions import DeleteRendezvousKeys
from ddpjob_operator.decide.observation import what_to_observe
from ddpjob_operator.decide.reconcile import reconcile
from ddpjob_operator.decide.writes import write_due


async def run_pass(ctx: PassContext, key: JobKey) -> PassOutcome:
    """One pass over the job ``key``, observed from the cache."""
    namespace, name = key
    await ctx.cache.synced()
    with metrics.timed_pass():
        job = ctx.cache.job(namespace, name)
        if job is None:
            metrics.observe_job(namespace, name, None)
            ctx.creates.forget(key)
            ctx.memory.forget((namespace, network_policy_name(name)))
            ctx.statuses.forget(key)
            return PassOutcome(gone=True)
        settings, uid, stored = ctx.settings, job["metadata"].get("uid", ""), job.get("status") or {}
        # The status computed but not yet written, while nobody wrote over it (decide/writes.py).
        previous = ctx.statuses.previous(key, uid, stored)
        body = job if previous is stored else {**job, "status": previous}
        observed = await observe(ctx.api, ctx.cache, body, what_to_observe(body, settings.progress_poll), ctx.memory)
        now = datetime.datetime.now(datetime.timezone.utc)
        result = reconcile(body, observed, now, operator=settings.operator, create_failure=ctx.creates.last(key),
                           max_replicas=settings.max_replicas, progress_poll=settings.progress_poll)
        if write_due(stored, result.status, ctx.statuses.since_write(key), settings.status_write_interval):
            await apply.write_status(ctx.api, ctx.cache, job, result.status)
            ctx.statuses.wrote(key, uid)
        else:
            ctx.statuses.keep(key, result.status)
        requeue = await apply.apply(ctx.api, ctx.cache, job, observed.pods, result.actions, ctx.creates, ctx.memory)
        await post_events(ctx.api, job, result.events)
    metrics.observe_job(namespace, name, result.status.get("phase"))
    metrics.observe_goodput(namespace, name, result.status, now)
    metrics.observe_budget(namespace, name, result.status, result.spec)
    metrics.observe_step_advanced(namespace, name, result.status)
    for action in result.actions:
        if isinstance(action, DeleteRendezvousKeys) and ctx.cleaner is not None:
            ctx.cleaner.start(job, action)
    return PassOutcome(requeue, "; ".join(str(e) for e in result.errors))
