"""Kubernetes quantities as numbers: every form the spec accepts has a value, sizes read back well."""
from __future__ import annotations

import re
from decimal import Decimal

import pytest

from ddpjob_operator.api.quantity import format_bytes, parse_quantity
from ddpjob_operator.api.spec import QUANTITY_PATTERN


@pytest.mark.parametrize("text,value", [
    ("1Gi", 1 << 30), ("16Gi", 16 << 30), ("512Mi", 512 << 20), ("1Ki", 1024), ("1Ei", 1 << 60),
    ("1G", 10**9), ("1k", 1000), ("2E", 2 * 10**18),  # E is exa, not an exponent
    ("500m", Decimal("0.5")), ("250u", Decimal("0.00025")), ("3n", Decimal("3e-9")),
    ("1.5Gi", 3 << 29), (".5", Decimal("0.5")), ("+1k", 1000), ("-2", -2), ("7", 7),
    ("1e3", 1000), ("1E3", 1000), ("25e-1", Decimal("2.5")),
    (3, 3), (17179869184, 16 << 30),
])
def test_quantities_parse_to_their_value(text, value):
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "Gi", "1GiB", "1gi", "1 Gi", "0x10", "1K", "--1"])
def test_text_that_is_not_a_quantity_is_rejected_naming_it(text):
    assert not re.match(QUANTITY_PATTERN, text)  # the spec rejects it first, with the same view
    with pytest.raises(ValueError, match=re.escape(f"{text!r} is not a Kubernetes quantity")):
        parse_quantity(text)


@pytest.mark.parametrize("text", ["1e1.5", "1.e2", ".5e-1", "5.", "+.5Ki"])
def test_every_odd_form_the_spec_pattern_accepts_still_parses(text):
    assert re.match(QUANTITY_PATTERN, text)
    assert parse_quantity(text) > 0


@pytest.mark.parametrize("count,text", [
    (8 << 30, "8Gi"), (1536 << 20, "1536Mi"), (3 << 10, "3Ki"), (1000, "1000"), (0, "0"),
])
def test_byte_counts_format_with_the_largest_exact_binary_suffix(count, text):
    assert format_bytes(count) == text
    assert parse_quantity(text) == count


def test_an_exponent_beyond_any_limit_is_infinity_not_an_error():
    """A hostile "1e999999999" compares as larger than any limit instead of raising."""
    assert parse_quantity("1e999999999") > parse_quantity("1Ei")
