"""kopf wiring: which events reach the operator, and what each is handed to. Registration only.

The work is elsewhere: state.py (the process's state and what a job event starts),
passes.py (when passes run), job_pass.py (one pass: observe.py, decide.reconcile, apply.py),
etcd_cleanup.py (rendezvous keys). Passes of one job never overlap, at most
--max-concurrent-passes run at once, and pod events reach them through the cache's watches.
"""
from __future__ import annotations

import logging
from typing import Any

import kopf

from ddpjob_operator.api import constants as C
from ddpjob_operator.controller import kube
from ddpjob_operator.controller.etcd_cleanup import needs_finalizer
from ddpjob_operator.controller.job_pass import run_pass
from ddpjob_operator.controller.state import OperatorState


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    return kube.login(**kwargs)


@kopf.on.startup()
async def start(memo: kopf.Memo, logger: logging.Logger, **kwargs: Any) -> None:
    info = kube.login(logger=logger, **kwargs)
    if info is None:
        raise kopf.PermanentError("no Kubernetes credentials: neither a service account nor a kubeconfig was found")
    memo.operator = OperatorState.start(info, memo, run_pass)
    # Before kopf's keep-alive starts (kopf holds it until the startup handlers finish), so that its
    # first heartbeat finds the peering object.
    await memo.operator.follow_peering()


@kopf.on.cleanup()
async def stop(memo: kopf.Memo, **_: Any) -> None:
    await memo.operator.stop()


@kopf.on.resume(C.GROUP, C.VERSION, C.PLURAL)
@kopf.on.create(C.GROUP, C.VERSION, C.PLURAL)
@kopf.on.update(C.GROUP, C.VERSION, C.PLURAL)
async def job_changed(body: kopf.Body, namespace: str, name: str, memo: kopf.Memo, retry: int = 0,
                      **_: Any) -> None:
    """A job appeared, changed its spec or was found at start-up (see OperatorState.job_changed)."""
    await memo.operator.job_changed(body, (namespace, name), retry)


@kopf.on.delete(C.GROUP, C.VERSION, C.PLURAL, when=needs_finalizer)
async def job_deleted(body: kopf.Body, retry: int, memo: kopf.Memo, **_: Any) -> None:
    """An etcd-v3 job is being deleted: its rendezvous keys go (bounded; see etcd_cleanup)."""
    await memo.operator.job_deleted(body, retry)
