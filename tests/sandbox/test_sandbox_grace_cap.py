"""The sandbox node agent's cap on grace periods is explicit: applied, and logged when it cuts one short."""

import logging

from ddpjob_sandbox.node.agent import MAX_GRACE_SECONDS, capped_grace


def test_a_grace_period_above_the_cap_is_cut_with_a_warning_naming_the_pod(caplog):
    with caplog.at_level(logging.WARNING, logger="ddpjob_sandbox.node.agent"):
        assert capped_grace("mlp-node-0", 30, MAX_GRACE_SECONDS) == 5.0
    assert caplog.messages == ["pod mlp-node-0: terminationGracePeriodSeconds 30 capped at the sandbox's 5 s "
                               "(max_grace_seconds)"]


def test_an_unset_grace_period_is_the_apis_default_and_a_short_one_is_kept_silently(caplog):
    with caplog.at_level(logging.WARNING, logger="ddpjob_sandbox.node.agent"):
        assert capped_grace("p", 3, 5.0) == 3.0
        assert capped_grace("p", None, 60.0) == 30.0
    assert caplog.messages == []
