"""The operator image must not pull torch: ddpjob-rdzv carries what both the trainer and the operator need."""
from __future__ import annotations

import re
from importlib.metadata import distribution

from packaging.requirements import Requirement


def closure(name: str) -> set[str]:
    """Names of ``name`` and every distribution it requires, transitively (extras ignored)."""
    seen, todo = set(), [name]
    while todo:
        current = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if current in seen:
            continue
        seen.add(current)
        for text in distribution(current).requires or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return seen


def test_the_operator_and_rdzv_distributions_do_not_depend_on_torch():
    assert "torch" not in closure("ddpjob-operator")
    assert "torch" not in closure("ddpjob-rdzv")


def test_both_the_trainer_and_the_operator_get_the_key_layout_from_ddpjob_rdzv():
    assert "ddpjob-rdzv" in closure("ddpjob-trainer")
    assert "ddpjob-rdzv" in closure("ddpjob-operator")
    assert "etcd3" in closure("ddpjob-rdzv")
