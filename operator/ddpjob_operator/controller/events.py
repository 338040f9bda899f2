"""The one place that posts Events on a DDPJob: a pass's, and those of the work it starts (the
rendezvous key cleanup).

Like kubelet and controllers, a lost Event fails nothing: it is logged, and the pass or the
deletion goes on.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

import kopf

from ddpjob_operator.controller import kube
from ddpjob_operator.decide.actions import Event

logger = logging.getLogger("ddpjob_operator")


async def post_events(api: kube.Kube, job: Mapping[str, Any], events: Iterable[Event]) -> None:
    """Posts ``events`` on ``job``, in order."""
    for event in events:
        try:
            await api.post_event(job, event.type, event.reason, event.message)
        except (kube.ApiError, kopf.TemporaryError) as e:
            logger.warning("Could not post the %s Event about %s: %s", event.reason, job["metadata"]["name"], e)
