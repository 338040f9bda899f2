"""Real torchrun, one node: a DoNotRetry stops the agent, so the container exits at once with
``fatal`` in its termination message instead of torchrun restarting the workers --max_restarts
times (each of which would raise again). The fast twin of the sandbox scenario in
tests/cluster/sandbox/test_hangs.py."""
from __future__ import annotations

import signal
import time

from ddpjob_rdzv.contract import progress_record
from ddpjob_trainer.report.metrics import read_metrics
from ddpjob_rdzv.contract import TERMINATION_LOG_ENV
from ddpjob_sandbox.torchrun import AgentGroup, Rendezvous, example_target


def test_do_not_retry_stops_torchrun_instead_of_letting_it_restart_the_workers(tmp_path):
    message = tmp_path / "termination-log"
    message.touch()  # the kubelet creates the file before the container starts
    target = example_target(tmp_path, epochs=1, samples=512, step_sleep=0.0) + ["--do-not-retry-at-step", "2"]
    env = {TERMINATION_LOG_ENV: str(message), "DDPJOB_NODE_INDEX": "0"}
    with AgentGroup(tmp_path, Rendezvous.c10d(nnodes="1"), target, env=env, max_restarts=3) as group:
        group.start("node0", rdzv_conf_extra={"is_host": True})
        started = time.monotonic()
        codes = group.wait_all(timeout=120)
        took = time.monotonic() - started

    assert codes["node0"] not in (0, None), group.logs()
    record = progress_record.parse(message.read_text().rstrip()).data
    assert record["fatal"] == {"reason": "InjectedFault",
                               "message": "do_not_retry_at_step=2: giving up on purpose (testing flag)"}
    starts = [e for e in read_metrics(tmp_path / "metrics.jsonl") if e["event"] == "start"]
    assert len(starts) == 1, f"torchrun restarted the workers: {starts}"
    assert f"got signal: {int(signal.SIGTERM)}" in group.logs(20000), group.logs()
    print(f"torchrun exited {took:.1f} s after start, without a restart")
