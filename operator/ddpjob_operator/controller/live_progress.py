"""Reads a running job's progress from its node pods' progress endpoints.

Termination messages (failure.pod_progress) tell the operator where training stood only
when a container exits. While a job runs, the local-rank-0 worker of each node also serves
the same record at ``GET /progress`` on the pod's ``progress`` port
(ddpjob_trainer/termination.py), and each pass of a running job reads it from one node,
so ``status.lastSnapshot``, the STEP column and the recovery figures follow training.

The operator reaches pods the way Prometheus does (pod IP and port); where a NetworkPolicy
forbids that, this finds nothing and the status falls back to termination messages. A
pod that does not answer within TIMEOUT_SECONDS is skipped; at most MAX_PODS are asked.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

import aiohttp

from ddpjob_operator.api import constants as C
from ddpjob_operator.decide.observed import PodView, read_progress

log = logging.getLogger("ddpjob_operator")

TIMEOUT_SECONDS = 2.0  # per pod: a pass must not wait long on a busy or unreachable node
MAX_PODS = 2  # the nodes share one snapshot record; a second is asked only when the first fails
PATH = "/progress"


def progress_urls(pods: Iterable[PodView]) -> list[str]:
    """The progress endpoints of the running node pods, lowest node index first."""
    urls = []
    running = [p for p in pods if not p.is_store and p.phase == "Running" and not p.deleting]
    for pod in sorted(running, key=lambda p: p.index if p.index is not None else 1 << 30):
        port = pod.ports.get(C.PROGRESS_PORT_NAME)
        if pod.ip and port:
            host = f"[{pod.ip}]" if ":" in pod.ip else pod.ip
            urls.append(f"http://{host}:{port}{PATH}")
    return urls


async def read_live_progress(pods: Iterable[PodView]) -> list[dict[str, Any]]:
    """The progress record of the first running node that answers ([] when none does)."""
    timeout = aiohttp.ClientTimeout(total=TIMEOUT_SECONDS)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for url in progress_urls(pods)[:MAX_PODS]:
            try:
                async with session.get(url) as response:
                    text = await response.text() if response.status == 200 else ""
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as error:
                log.debug("No progress from %s: %s", url, error or type(error).__name__)
                continue
            record = read_progress(text)
            if record is not None:
                return [record]
    return []
