"""Reading a JSON body from outside (the control API, the gateway): UTF-8, finite
numbers, nesting bounded — refused with one message naming what is wrong, never a
traceback. The body's size is bounded by the caller before it is read."""

from __future__ import annotations

import json
import math
from typing import Any


class JsonInputError(ValueError):
    """The body is not JSON this node takes; `str(e)` says why, for the client."""


def finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):  # `1e999`: no field anywhere takes it
        raise ValueError(f"number out of range: {text[:32]}")
    return value


def refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def loads_bounded(raw: bytes, max_depth: int) -> Any:
    """The body's JSON, or JsonInputError when it is not UTF-8, not JSON, nested deeper
    than `max_depth` or holds a non-finite number."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise JsonInputError(f"the body is not UTF-8 (byte {e.start} is not valid UTF-8)") from e
    try:
        data = json.loads(text, parse_float=finite_float, parse_constant=refuse_constant)
    except RecursionError as e:
        raise JsonInputError(f"the body is nested deeper than {max_depth} levels") from e
    except ValueError as e:
        raise JsonInputError(f"the body is not JSON: {str(e)[:200]}") from e
    if _depth_exceeds(data, max_depth):
        raise JsonInputError(f"the body is nested deeper than {max_depth} levels")
    return data


def _depth_exceeds(value: object, limit: int) -> bool:
    """Whether `value` nests deeper than `limit` (iterative: no recursion to run out of)."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: list[object] = list(item.values())
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False
