"""Reading a JSON body from outside (the control API, the gateway): UTF-8, finite
numbers, nesting bounded — refused with one message naming what is wrong, never a
traceback. The body's size is bounded by the caller before it is read."""

from __future__ import annotations

import json
import math
import re
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


#: a JSON string: removed before counting, so brackets inside one do not count
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
#: every bracket as `[` or `]`, every other byte deleted (depth does not care which kind)
_SQUARE = bytes.maketrans(b"{}", b"[]")
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")


#: a run of openers or of closers, once only `[` and `]` are left
_RUN = re.compile(rb"\[+|\]+")
#: runs few enough to walk one by one in Python
_WALKED_RUNS = 4096


def nesting_exceeds(raw: bytes, max_depth: int) -> bool:
    """Whether the JSON text `raw` opens more than `max_depth` arrays or objects inside one
    another, without parsing it: for a body passed on as it is (a Triton inference request,
    megabytes of numbers), where a parser given 200,000 levels overflows its stack.

    Only the brackets outside strings are kept. While they form many runs (rows of a
    tensor: `[1,2],[3,4]`), each pass deletes every innermost pair at once, in C, and takes
    one level off the deepest nesting; once few runs are left (deep nesting is few long
    runs), they are walked, counting openers left unclosed as levels too.
    """
    if raw.count(b"[") + raw.count(b"{") <= max_depth:
        return False  # too few openers to nest that deep: most bodies stop here
    # without a backslash no quote is escaped: every other piece between quotes is a string
    outside = b"".join(raw.split(b'"')[::2]) if b"\\" not in raw else _STRING.sub(b"", raw)
    brackets = outside.translate(_SQUARE, _NOT_BRACKET)
    removed = 0
    while brackets.count(b"[]") + brackets.count(b"][") > _WALKED_RUNS:
        brackets = brackets.replace(b"[]", b"")
        removed += 1
        if removed > max_depth:
            return True
    depth = peak = 0
    for run in _RUN.finditer(brackets):
        if run.group()[0] == ord("["):
            depth += len(run.group())
            peak = max(peak, depth)
        else:
            depth = max(0, depth - len(run.group()))
    return removed + peak > max_depth


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
