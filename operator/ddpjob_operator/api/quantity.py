"""Kubernetes resource quantities as numbers, and byte counts back as quantities (pure).

The spec keeps a quantity as the user wrote it ("16Gi", "500M", 2); render/ needs its
value to derive one setting from another (the /dev/shm size from the memory limit).
The suffixes are apimachinery's resource.Quantity ones:
https://kubernetes.io/docs/reference/kubernetes-api/common-definitions/quantity/
"""

from __future__ import annotations

import re
from decimal import Context, Decimal, localcontext

KI, MI, GI = 1 << 10, 1 << 20, 1 << 30

_BINARY = {"Ki": KI, "Mi": MI, "Gi": GI, "Ti": 1 << 40, "Pi": 1 << 50, "Ei": 1 << 60}
_DECIMAL = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
            "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"),
            "P": Decimal("1e15"), "E": Decimal("1e18")}
_NUMBER = r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
# The same language as spec.QUANTITY_PATTERN (apimachinery's OpenAPI pattern), so every value
# the spec accepts has a value here.
_QUANTITY = re.compile(rf"^({_NUMBER})(?:([KMGTPE]i|[numkMGTPE])|[eE]({_NUMBER}))?$")


def parse_quantity(value: int | str) -> Decimal:
    """The value of a quantity: parse_quantity("1Gi") == 1073741824, parse_quantity("500m") == 0.5.

    Raises:
        ValueError: `value` is not a Kubernetes quantity.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        return Decimal(value)
    match = _QUANTITY.match(value) if isinstance(value, str) else None
    if match is None:
        raise ValueError(f"{value!r} is not a Kubernetes quantity (e.g. 2, \"500m\", \"16Gi\", \"1e3\")")
    number, suffix, exponent = match.groups()
    with localcontext(Context(traps=[])):  # "1e999999999" is Infinity (over any limit), not an exception
        if exponent is not None:
            return Decimal(number) * Decimal(10) ** Decimal(exponent)
        scale = _BINARY.get(suffix or "")
        return Decimal(number) * (scale if scale is not None else _DECIMAL[suffix or ""])


def format_bytes(count: int) -> str:
    """A byte count as the quantity a person reads best: "8Gi", "768Mi", else plain bytes."""
    for suffix, scale in (("Gi", GI), ("Mi", MI), ("Ki", KI)):
        if count and count % scale == 0:
            return f"{count // scale}{suffix}"
    return str(count)
