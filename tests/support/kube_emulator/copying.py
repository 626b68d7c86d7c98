"""Copies of stored objects, which are JSON documents: dicts, lists and immutable scalars.

The store copies an object on every read and write (no caller may hold the stored one),
so the copy is on every request's path. `copy.deepcopy` pays for generality JSON does not
need (a memo of every node, dispatch by type); this walks dicts and lists only and hands
anything else to `copy.deepcopy`, so any value is still copied deeply.
"""

from __future__ import annotations

import copy
from typing import TypeVar

T = TypeVar("T")
_IMMUTABLE = (str, int, float, bool, type(None))


def clone(value: T) -> T:
    """A deep copy of `value` (shared sub-documents become separate copies)."""
    kind = type(value)
    if kind is dict:
        return {k: clone(v) for k, v in value.items()}  # type: ignore[attr-defined, return-value]
    if kind is list:
        return [clone(v) for v in value]  # type: ignore[attr-defined, return-value]
    if kind in _IMMUTABLE:
        return value
    return copy.deepcopy(value)
