"""What the import-layer tests of the operator and the trainer both ask of a module graph."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache


def longest_chain(graph: Mapping[str, Sequence[str]]) -> list[str]:
    """The longest run of imports ``a -> b -> ...`` in ``graph`` (module -> modules it imports,
    every target a key; no circles: a circle is reported by its own test)."""

    @lru_cache(maxsize=None)
    def chain(module: str) -> tuple[str, ...]:
        below = [chain(t) for t in graph[module]]
        return (module,) + max(below, key=len, default=())

    return list(max((chain(m) for m in graph), key=len))
