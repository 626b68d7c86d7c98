"""Label selectors (equality- and set-based) and field selectors, as list and watch use them."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from tests.support.kube_emulator.errors import bad_request

Predicate = Callable[[Mapping[str, Any]], bool]

_SET_RE = re.compile(r"^\s*(?P<key>[^\s!=()]+)\s+(?P<op>in|notin)\s+\((?P<values>[^)]*)\)\s*$")
_EQ_RE = re.compile(r"^\s*(?P<key>[^\s!=]+)\s*(?P<op>==|=|!=)\s*(?P<value>[^\s]*)\s*$")
_EXISTS_RE = re.compile(r"^\s*(?P<neg>!?)\s*(?P<key>[^\s!=()]+)\s*$")


def _split_terms(selector: str) -> list[str]:
    """Split at commas outside parentheses: `a in (x,y),b` → [`a in (x,y)`, `b`]."""
    terms, depth, start = [], 0, 0
    for i, ch in enumerate(selector):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            terms.append(selector[start:i])
            start = i + 1
    terms.append(selector[start:])
    return [t for t in terms if t.strip()]


def _label_term(term: str) -> Callable[[Mapping[str, str]], bool]:
    if m := _SET_RE.match(term):
        key, values = m["key"], {v.strip() for v in m["values"].split(",") if v.strip()}
        if m["op"] == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    if m := _EQ_RE.match(term):
        key, value = m["key"], m["value"]
        if m["op"] == "!=":
            return lambda labels: labels.get(key) != value
        return lambda labels: labels.get(key) == value
    if m := _EXISTS_RE.match(term):
        key = m["key"]
        if m["neg"]:
            return lambda labels: key not in labels
        return lambda labels: key in labels
    raise bad_request(f"unable to parse requirement: {term!r}")


def label_selector(selector: str | None) -> Predicate:
    """A predicate on whole objects; an empty selector matches everything."""
    if not selector:
        return lambda obj: True
    terms = [_label_term(t) for t in _split_terms(selector)]

    def matches(obj: Mapping[str, Any]) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return all(term(labels) for term in terms)

    return matches


def field_value(obj: Mapping[str, Any], path: str) -> str | None:
    """The string form a field selector compares with; None when the field is absent."""
    value: Any = obj
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    if isinstance(value, bool):
        return "true" if value else "false"
    return None if value is None else str(value)


def field_selector(selector: str | None, supported: frozenset[str]) -> Predicate:
    """`metadata.name=x,metadata.namespace!=y`; 400 for a field the resource does not index."""
    if not selector:
        return lambda obj: True
    checks: list[tuple[str, bool, str]] = []
    for term in _split_terms(selector):
        m = _EQ_RE.match(term)
        if m is None:
            raise bad_request(f"invalid field selector: {term!r}")
        if m["key"] not in supported:
            raise bad_request(f"field label not supported: {m['key']}")
        checks.append((m["key"], m["op"] != "!=", m["value"]))

    def matches(obj: Mapping[str, Any]) -> bool:
        return all(((field_value(obj, k) or "") == v) == eq for k, eq, v in checks)

    return matches
