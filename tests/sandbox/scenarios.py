"""Scenario steps shared by the whole-loop tests in this folder."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ddpjob_sandbox.jobs import job_snapshot_dir
from ddpjob_sandbox.client import KubeClient
from ddpjob_sandbox.examples import example_job, kubectl_apply
from ddpjob_sandbox.metrics import JobProgress
from ddpjob_sandbox.node import NodeAgent
from ddpjob_sandbox.procs import free_port


def start_job(k8s: KubeClient, agent: NodeAgent, workdir: Path, *, args: list[str], rdzv_store: str = "node",
              edit: Callable[[dict], None] | None = None) -> tuple[JobProgress, dict]:
    """Applies the test-speed c10d example (see example_job) and follows it.

    ``rdzv_store`` is always set (the default may change); ``edit`` changes the spec further.
    Returns the progress follower and the applied body.
    """
    body = example_job(args=args, rdzv_port=free_port())
    body["spec"]["elasticPolicy"]["rdzvStore"] = rdzv_store
    if edit is not None:
        edit(body["spec"])
    kubectl_apply(k8s, body, workdir)
    claim = body["spec"]["snapshot"]["volume"]["persistentVolumeClaim"]["claimName"]
    return JobProgress(k8s, agent, body["metadata"]["name"], job_snapshot_dir(agent.claim_dir(claim), body["metadata"]["name"]) / "metrics.jsonl"), body
