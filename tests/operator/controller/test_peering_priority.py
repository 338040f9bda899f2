"""Peering priorities (pure): kopf pauses every operator when two live peers share a priority, so
replicas started from one Deployment (same flags) must still rank differently. The replicas
themselves, helm-installed with peering, are tests/cluster/e2e/test_operator_peering.py's."""
import subprocess
import sys

import pytest

from ddpjob_operator.controller.main import own_start_time, parse_args, settings_for, standby_priority
from ddpjob_rdzv.process_start import stable_start_time

PEERING = "ddpjob-operator"


def test_an_older_process_ranks_higher_so_the_incumbent_keeps_acting():
    assert standby_priority(1_700_000_000.0) > standby_priority(1_700_000_000.001) > 0
    # Whatever tie breakers the two drew: a millisecond older always ranks higher.
    assert standby_priority(1_700_000_000.0, 0) > standby_priority(1_700_000_000.001, 999)


def test_two_processes_started_in_one_millisecond_rank_by_their_tie_breaker():
    assert standby_priority(1_700_000_000.0, 2) > standby_priority(1_700_000_000.0, 1)
    with pytest.raises(ValueError, match=r"tie_breaker \(1000\) must be in 0..999"):
        standby_priority(1_700_000_000.0, 1000)


def test_the_priority_counts_from_the_process_start_not_from_the_end_of_its_imports():
    # Under load an operator's imports take seconds: a replica started first but slower to import
    # must still rank higher. Its start is read from /proc, the same on every read.
    assert own_start_time() == stable_start_time()
    later = subprocess.run([sys.executable, "-c", "from ddpjob_rdzv.process_start import stable_start_time as s;"
                            "print(repr(s()))"], capture_output=True, text=True, check=True)
    assert own_start_time() <= float(later.stdout)
    assert standby_priority(own_start_time()) > standby_priority(float(later.stdout))


def test_peering_replicas_get_distinct_priorities_unless_one_is_given():
    first = settings_for(parse_args(["--peering", PEERING])).peering.priority
    assert first > 0
    assert settings_for(parse_args(["--peering", PEERING, "--priority", "7"])).peering.priority == 7


def test_a_priority_without_peering_is_refused_naming_both_flags(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--priority", "7"])
    assert "--priority only matters with --peering NAME" in capsys.readouterr().err
