"""Byte quantities (`4Gi`, `512Mi`, 1048576) and durations (`5m`, `1h30m`, `never`).

The CRD's patterns already refuse zero, negatives, the milli suffix and fractions; these
parsers repeat the check so values that never went through the API server are safe too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from modelswap_api.errors import QuantityError

QUANTITY_PATTERN = r"^[1-9][0-9]{0,15}(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$"
DURATION_PATTERN = r"^(never|([0-9]+(ms|s|m|h))+)$"

_SUFFIX_MULTIPLIER = {
    "": 1,
    "Ki": 1 << 10,
    "Mi": 1 << 20,
    "Gi": 1 << 30,
    "Ti": 1 << 40,
    "Pi": 1 << 50,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
}
_QUANTITY_RE = re.compile(QUANTITY_PATTERN)
_DURATION_RE = re.compile(DURATION_PATTERN)
_DURATION_PART_RE = re.compile(r"([0-9]+)(ms|s|m|h)")
_DURATION_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}

NEVER = "never"


def parse_bytes(value: int | str) -> int:
    """Bytes of a quantity; refuses zero, negatives, fractions and the milli suffix."""
    if isinstance(value, bool):
        raise QuantityError(f"{value!r} is not a quantity")
    if isinstance(value, int):
        if value < 1:
            raise QuantityError(f"quantity {value} must be at least 1 byte")
        return value
    match = _QUANTITY_RE.match(value)
    if match is None:
        raise QuantityError(
            f"quantity {value!r} must be a positive whole number of bytes with an optional "
            "suffix Ki, Mi, Gi, Ti, Pi, k, M, G, T or P (no fractions, no milli suffix m)"
        )
    suffix = match.group(1) or ""
    return int(value[: len(value) - len(suffix)]) * _SUFFIX_MULTIPLIER[suffix]


def parse_seconds(value: str) -> float | None:
    """Seconds of a duration such as `1h30m` or `500ms`; None for `never`."""
    if _DURATION_RE.match(value) is None:
        raise QuantityError(
            f"duration {value!r} must be `never` or numbers with units ms, s, m, h (e.g. 1h30m)"
        )
    if value == NEVER:
        return None
    return sum(
        int(number) * _DURATION_UNIT_SECONDS[unit]
        for number, unit in _DURATION_PART_RE.findall(value)
    )


@dataclass(frozen=True)
class Quantity:
    """A byte quantity as written (kept for round trips) and its value in bytes."""

    raw: int | str

    def __post_init__(self) -> None:
        parse_bytes(self.raw)

    @property
    def bytes(self) -> int:
        return parse_bytes(self.raw)


@dataclass(frozen=True)
class Duration:
    """A duration as written (kept for round trips) and its value in seconds."""

    raw: str

    def __post_init__(self) -> None:
        parse_seconds(self.raw)

    @property
    def seconds(self) -> float | None:
        """Seconds, or None for `never`."""
        return parse_seconds(self.raw)

    @property
    def is_never(self) -> bool:
        return self.raw == NEVER


_BINARY_SUFFIXES = (
    ("Pi", 1 << 50),
    ("Ti", 1 << 40),
    ("Gi", 1 << 30),
    ("Mi", 1 << 20),
    ("Ki", 1 << 10),
)


def format_bytes(count: int) -> str:
    """A byte count as people read it in `kubectl get` (the status' `...Size` twins of its
    `...Bytes` fields): binary suffixes, at most three significant digits, rounded down so
    a size never claims more than there is: 0, 999, 1.5Ki, 512Mi, 14.2Gi, 120Gi. Every
    result is a valid Kubernetes quantity."""
    if count < 1024:
        return str(max(count, 0))
    for suffix, multiplier in _BINARY_SUFFIXES:
        if count >= multiplier:
            whole = count / multiplier
            decimals = 0 if whole >= 100 else 1 if whole >= 10 else 2
            scale = 10**decimals
            text = f"{int(whole * scale) / scale:.{decimals}f}"
            if "." in text:
                text = text.rstrip("0").rstrip(".")
            return f"{text}{suffix}"
    raise AssertionError("unreachable: count >= 1024 has a suffix")
