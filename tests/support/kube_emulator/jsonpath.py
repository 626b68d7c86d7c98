"""The JSONPath subset printer columns use: `.a.b`, `.a.b\\.c/d` (an escaped dot, as in a
label's key), `['a.b']`, `[0]`, `[*]`, `[?(@.x=="y")]`."""

from __future__ import annotations

import re
from typing import Any

_TOKEN = re.compile(
    r"""\.(?P<field>(?:[A-Za-z0-9_$/-]|\\\.)+)
      | \[\s*(?P<quote>['"])(?P<key>.*?)(?P=quote)\s*\]
      | \[\s*(?P<index>-?\d+)\s*\]
      | \[\s*\*\s*\]
      | \[\?\(\s*@\.(?P<fpath>[A-Za-z0-9_.]+)\s*(?P<op>==|!=)\s*(?P<fq>['"]?)(?P<fval>.*?)(?P=fq)\s*\)\]
    """,
    re.VERBOSE,
)


def _steps(path: str) -> list[re.Match[str]]:
    path = path.strip()
    if path.startswith("{") and path.endswith("}"):
        path = path[1:-1]
    path = path.removeprefix("$")
    steps, pos = [], 0
    while pos < len(path):
        m = _TOKEN.match(path, pos)
        if m is None:
            raise ValueError(f"unsupported JSONPath {path!r} at {pos}")
        steps.append(m)
        pos = m.end()
    return steps


def _lookup(value: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def find(obj: Any, path: str) -> list[Any]:
    """Every value the path reaches (an empty list when it reaches none)."""
    current = [obj]
    for step in _steps(path):
        nxt: list[Any] = []
        for value in current:
            if step["field"] is not None or step["key"] is not None:
                name = (
                    step["field"].replace("\\.", ".") if step["field"] is not None else step["key"]
                )
                if isinstance(value, dict) and name in value:
                    nxt.append(value[name])
            elif step["index"] is not None:
                i = int(step["index"])
                if isinstance(value, list) and -len(value) <= i < len(value):
                    nxt.append(value[i])
            elif step["fpath"] is not None:
                if isinstance(value, list):
                    for item in value:
                        got = _lookup(item, step["fpath"])
                        text = str(got).lower() if isinstance(got, bool) else str(got)
                        if (got is not None and text == step["fval"]) == (step["op"] == "=="):
                            nxt.append(item)
            elif isinstance(value, list):
                nxt.extend(value)
            elif isinstance(value, dict):
                nxt.extend(value.values())
        current = nxt
    return current
