"""Peering priorities (pure): kopf pauses every operator when two live peers share a priority, so
replicas started from one Deployment (same flags) must still rank differently. The replicas
themselves, helm-installed with peering, are tests/cluster/e2e/test_operator_peering.py's."""
import pytest

from ddpjob_operator.controller.main import parse_args, settings_for, standby_priority

PEERING = "ddpjob-operator"


def test_an_older_process_ranks_higher_so_the_incumbent_keeps_acting():
    assert standby_priority(1_700_000_000.0) > standby_priority(1_700_000_000.001) > 0


def test_peering_replicas_get_distinct_priorities_unless_one_is_given():
    first = settings_for(parse_args(["--peering", PEERING])).peering.priority
    assert first > 0
    assert settings_for(parse_args(["--peering", PEERING, "--priority", "7"])).peering.priority == 7


def test_a_priority_without_peering_is_refused_naming_both_flags(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--priority", "7"])
    assert "--priority only matters with --peering NAME" in capsys.readouterr().err
