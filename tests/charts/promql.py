"""The metric names a PromQL expression selects, by a small strict tokenizer (no parser is installed).

PromQL names a series by a bare identifier (``rate(x_total[5m])``) or by ``__name__`` in a
matcher (``{__name__="x"}``, which the chart does not use and this rejects). Every other
identifier is a function or aggregation (followed by ``(``, or an aggregation by its grouping), a keyword, or a label name in a
grouping list (``by (le)``, ``on (namespace, name)``), skipped with its parentheses. Label
matchers, ranges, strings, numbers, durations and Grafana's ``$variables`` carry no metric name.
A character the tokenizer does not know fails loudly, so an expression it cannot read is never
silently taken to select nothing.
"""
from __future__ import annotations

import re

_STRING = r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`'
_TOKEN = re.compile(rf"""
    (?P<space>\s+)
  | (?P<string>{_STRING})
  | (?P<matchers>\{{(?:{_STRING}|[^}}"'`])*\}})   # {{label="value", ...}}
  | (?P<range>\[[^\]]*\])                            # [5m], [1h:1m], [$__rate_interval]
  | (?P<number>(?:\d+(?:\.\d*)?|\.\d+)(?:e[-+]?\d+)?(?:ms|[smhdwy])?(?:\d+(?:ms|[smhdwy]))*)
  | (?P<variable>\$\{{[^}}]*\}}|\$\w+)                # Grafana's template variables
  | (?P<name>[A-Za-z_:][\w:]*)
  | (?P<operator>[-+*/%^=!<>~]+|[(),])
""", re.VERBOSE)
KEYWORDS = {"and", "or", "unless", "bool", "offset", "atan2", "inf", "nan"}
GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
# Aggregations may put their grouping first: `sum by (le) (rate(...))`.
AGGREGATIONS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk",
                "topk", "quantile", "limitk", "limit_ratio"}


class PromQLSyntaxError(ValueError):
    """A character or construct the tokenizer does not read."""


def tokens(expr: str) -> list[tuple[str, str]]:
    """(kind, text) of each token, spaces dropped.

    Raises:
        PromQLSyntaxError: naming the position and the character it cannot read.
    """
    found, position = [], 0
    while position < len(expr):
        match = _TOKEN.match(expr, position)
        if match is None:
            raise PromQLSyntaxError(f"{expr!r}: cannot read {expr[position]!r} at {position}")
        if match.lastgroup != "space":
            found.append((match.lastgroup, match.group()))
        position = match.end()
    return found


def metric_names(expr: str) -> set[str]:
    """The metric names ``expr`` selects.

    Raises:
        PromQLSyntaxError: for an unreadable expression, unbalanced parentheses, or a
            ``__name__`` matcher (a name this function would miss).
    """
    names, items, index, depth = set(), tokens(expr), 0, 0
    while index < len(items):
        kind, text = items[index]
        following = items[index + 1][1] if index + 1 < len(items) else None
        if kind == "matchers" and "__name__" in text:
            raise PromQLSyntaxError(f"{expr!r}: a __name__ matcher is not supported here")
        if kind == "name" and text in GROUPING and following == "(":
            close = next((i for i in range(index + 1, len(items)) if items[i][1] == ")"), None)
            if close is None:
                raise PromQLSyntaxError(f"{expr!r}: {text}( is never closed")
            index = close + 1
            continue
        aggregation = text in AGGREGATIONS and following in GROUPING
        if kind == "name" and text.lower() not in KEYWORDS and following != "(" and not aggregation:
            names.add(text)
        depth += {"(": 1, ")": -1}.get(text, 0) if kind == "operator" else 0
        if depth < 0:
            raise PromQLSyntaxError(f"{expr!r}: ')' without '('")
        index += 1
    if depth:
        raise PromQLSyntaxError(f"{expr!r}: {depth} '(' never closed")
    return names


_LABEL_VALUES = re.compile(r"\s*label_values\(\s*(?P<expr>.+),\s*(?P<label>[A-Za-z_]\w*)\s*\)\s*")


def grafana_query_names(query: str) -> set[str]:
    """The metric names a Grafana variable query selects: ``label_values(<selector>, <label>)``
    (the label is not a metric) or a plain expression."""
    match = _LABEL_VALUES.fullmatch(query)
    return metric_names(match["expr"] if match else query)
