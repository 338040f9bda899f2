"""Generated names agree with the contract and fit DNS labels."""

from __future__ import annotations

import pytest

from ddpjob_operator.api.names import (
    c10d_host,
    name_too_long,
    pod_fqdn,
    pod_hostname,
    pod_name,
    rdzv_endpoint,
    service_name,
)


def test_names_follow_the_contract():
    assert service_name("mlp") == "mlp"
    assert pod_name("mlp", 3) == "mlp-node-3"
    assert pod_hostname("mlp", 3) == "mlp-node-3"
    assert pod_fqdn("mlp", "team", 3) == "mlp-node-3.mlp.team.svc.cluster.local"
    assert rdzv_endpoint(c10d_host("mlp", "team"), 29400) == "mlp-node-0.mlp.team.svc.cluster.local:29400"


def test_the_rendezvous_host_is_node_zero_which_scale_down_never_removes():
    assert c10d_host("mlp", "ns").startswith(pod_name("mlp", 0) + ".")


@pytest.mark.parametrize("length,max_replicas", [(56, 1), (56, 10), (55, 11), (54, 100), (52, 10000)])
def test_longest_names_that_fit_are_accepted(length, max_replicas):
    assert name_too_long("a" * length, max_replicas) is None


def test_a_name_over_the_limit_says_the_longest_name_the_limit_and_what_fits():
    assert name_too_long("a" * 56, 11) == (
        f"is too long: pod name '{'a' * 56}-node-10' has 64 characters, over the DNS label limit of 63; "
        "use at most 55 characters")


def test_the_crd_rule_is_the_same_limit():
    """crd.NAME_LENGTH_RULE's bound is derived from the same constants, so both layers agree."""
    from ddpjob_operator.api.crd import NAME_LENGTH_RULE

    bound = int(NAME_LENGTH_RULE["rule"].rsplit("<=", 1)[1])
    assert name_too_long("a" * (bound - 1), 10) is None  # "9" is one digit
    assert name_too_long("a" * bound, 10) is not None
