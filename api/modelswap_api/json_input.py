"""Reading a JSON body from outside (the control API, the gateway): UTF-8, finite
numbers, nesting bounded — refused with one message naming what is wrong, never a
traceback. The body's size is bounded by the caller before it is read."""

from __future__ import annotations

import json
import math
from typing import Any


class JsonInputError(ValueError):
    """The body is not JSON this node takes; `str(e)` says why, for the client, and `path`
    names where in the body (`entries[1].spec.model`), or is "" for the body as a whole."""

    def __init__(self, message: str, path: str = "") -> None:
        super().__init__(message)
        self.path = path


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
    too_deep = _first_too_deep(data, max_depth)
    if too_deep is not None:
        raise JsonInputError(
            f"{too_deep or 'the body'} is nested deeper than {max_depth} levels", too_deep
        )
    return data


def _first_too_deep(value: object, limit: int) -> str | None:
    """The path of the first object or array nested deeper than `limit` ("" for the body
    itself), or None when none is (iterative: no recursion to run out of)."""
    stack: list[tuple[object, int, str]] = [(value, 1, "")]
    while stack:
        item, depth, path = stack.pop()
        if isinstance(item, dict):
            children = [(v, f"{path}.{k}" if path else str(k)) for k, v in item.items()]
        elif isinstance(item, list):
            children = [(v, f"{path}[{i}]") for i, v in enumerate(item)]
        else:
            continue
        if depth > limit:
            return path
        stack.extend((child, depth + 1, child_path) for child, child_path in reversed(children))
    return None
