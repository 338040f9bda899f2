"""Ctrl-C and SIGTERM stop `ddpjob run` whatever signal dispositions it inherited, and a second one
cannot cut the stop short. The end-to-end case (a real run started with SIGINT ignored) is
test_local_run.test_ctrl_c_stops_every_process_of_every_node."""
import io
import os
import signal
import time

import pytest

from ddpjob_operator.api.validation import parse_spec
from ddpjob_operator.local import runner as runner_module
from ddpjob_operator.local.command import _stop_signals_as_interrupt
from ddpjob_operator.local.plan import local_plan
from ddpjob_operator.local.runner import STOP_SIGNALS, RunOptions, Runner
from ddpjob_sandbox.jobs import make_spec


def deliver(sig: int) -> None:
    """Sends `sig` to this process and gives Python the moment it needs to run the handler."""
    os.kill(os.getpid(), sig)
    time.sleep(0.05)


@pytest.fixture
def sigint_ignored():
    """This process as a shell's background job starts: SIGINT ignored (Python then installs no handler)."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("sig", STOP_SIGNALS)
def test_a_stop_signal_interrupts_the_run_even_when_sigint_was_ignored_at_start(sigint_ignored, sig):
    with pytest.raises(KeyboardInterrupt), _stop_signals_as_interrupt():
        deliver(sig)
        pytest.fail(f"signal {sig} did not interrupt the run")
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN, "the inherited disposition is put back"


@pytest.mark.parametrize("second", STOP_SIGNALS)
def test_a_second_stop_signal_during_the_stop_cannot_cut_it_short(tmp_path, monkeypatch, sigint_ignored, second):
    spec = parse_spec(make_spec(snapshot={"mountPath": "/snapshots"}))
    plan = local_plan("job", spec, rdzv_id="job-1", run_dir=tmp_path, torchrun="torchrun")
    swept = []

    def stop_all_signalled_again(nodes):
        deliver(second)  # the impatient second Ctrl-C (or a supervisor's SIGTERM) while nodes stop

    monkeypatch.setattr(runner_module, "stop_all", stop_all_signalled_again)
    monkeypatch.setattr(runner_module, "kill_marked_until_gone", lambda marker, **kw: swept.append(marker))
    with _stop_signals_as_interrupt():
        runner = Runner(plan, tmp_path, RunOptions(), io.StringIO())
        try:
            runner._stop_everything()
        except KeyboardInterrupt:
            pytest.fail(f"signal {second} during the stop cut it short: nodes could be left running")
        assert swept == ["job-1."], "the sweep of every marked process of the run still ran"
        with pytest.raises(KeyboardInterrupt):  # after the stop, a stop signal interrupts again
            deliver(second)
