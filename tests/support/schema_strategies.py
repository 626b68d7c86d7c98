"""Hypothesis strategies drawn from an OpenAPI/CRD schema, and mutations of what they draw.

`from_schema(schema)` draws values the schema's own keywords describe (object properties,
required ones always, optional ones sometimes; `additionalProperties`; arrays up to a few
items; strings from `pattern`/`enum` within `maxLength`; integers within their bounds;
Kubernetes' int-or-string; `$ref` into `refs`, or to `overrides` by name). Values may still
break rules the keywords cannot say (CEL, cross-field rules): the system under test decides.

`mutated(strategy)` draws a value and then breaks it in 1 to 3 places: a key removed, a
value of the wrong type, an unknown key, an oversized string, map or list, deep nesting.

(hypothesis-jsonschema does not run with the hypothesis this project pins, so the
generator is this small one, for the keywords our schemas use.)
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any

from hypothesis import strategies as st

JsonValue = Any
_MAX_COLLECTION = 3
_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)


def _resolve(schema: Mapping[str, Any], refs: Mapping[str, Any]) -> Mapping[str, Any]:
    while "$ref" in schema:
        name = str(schema["$ref"]).rsplit("/", 1)[-1]
        schema = refs[name]
    return schema


def _string(schema: Mapping[str, Any]) -> st.SearchStrategy[str]:
    max_length = schema.get("maxLength")
    min_length = schema.get("minLength", 0)
    if "pattern" in schema:
        pattern = re.compile(schema["pattern"])
        strings = st.from_regex(pattern, fullmatch=True)
        if max_length is not None:
            strings = strings.filter(lambda s: len(s) <= max_length)
        return strings.filter(lambda s: len(s) >= min_length)
    return st.text(min_size=min_length, max_size=min(max_length or 24, 24))


def _integer(schema: Mapping[str, Any]) -> st.SearchStrategy[int]:
    low = schema.get("minimum")
    high = schema.get("maximum")
    return st.integers(
        min_value=-(2**40) if low is None else low, max_value=2**40 if high is None else high
    )


def from_schema(
    schema: Mapping[str, Any],
    *,
    refs: Mapping[str, Any] | None = None,
    overrides: Mapping[str, st.SearchStrategy[Any]] | None = None,
) -> st.SearchStrategy[JsonValue]:
    refs = refs or {}
    overrides = overrides or {}
    if "$ref" in schema:
        name = str(schema["$ref"]).rsplit("/", 1)[-1]
        if name in overrides:
            return overrides[name]
        return st.deferred(lambda: from_schema(refs[name], refs=refs, overrides=overrides))
    schema = _resolve(schema, refs)
    if "enum" in schema:
        return st.sampled_from(list(schema["enum"]))
    kind = schema.get("type")
    if schema.get("x-kubernetes-int-or-string"):
        numbers = _integer({"minimum": schema.get("minimum", 0), "maximum": 2**40})
        return st.one_of(numbers, _string(schema))
    if isinstance(kind, list):
        return st.one_of(*(from_schema({**schema, "type": k}, refs=refs) for k in kind))
    if kind == "string":
        return _string(schema)
    if kind == "integer":
        return _integer(schema)
    if kind == "number":
        return st.floats(allow_nan=False, allow_infinity=False, min_value=schema.get("minimum"))
    if kind == "boolean":
        return st.booleans()
    if kind == "array":
        items = schema.get("items", {})
        max_items = min(schema.get("maxItems", _MAX_COLLECTION), _MAX_COLLECTION)
        return st.lists(
            from_schema(items, refs=refs, overrides=overrides),
            min_size=schema.get("minItems", 0),
            max_size=max_items,
        )
    if kind == "object" or "properties" in schema:
        return _object(schema, refs, overrides)
    return _SCALARS


def _object(
    schema: Mapping[str, Any],
    refs: Mapping[str, Any],
    overrides: Mapping[str, st.SearchStrategy[Any]],
) -> st.SearchStrategy[dict[str, Any]]:
    properties = schema.get("properties", {})
    required = [k for k in schema.get("required", ()) if k in properties]
    optional = [k for k in properties if k not in required]
    fixed = st.fixed_dictionaries(
        {k: from_schema(properties[k], refs=refs, overrides=overrides) for k in required},
        optional={k: from_schema(properties[k], refs=refs, overrides=overrides) for k in optional},
    )
    additional = schema.get("additionalProperties")
    if isinstance(additional, Mapping):
        keys = st.from_regex(r"\A[a-z][a-z0-9./-]{0,20}\Z")
        max_size = min(schema.get("maxProperties", _MAX_COLLECTION), _MAX_COLLECTION)
        extra = st.dictionaries(
            keys, from_schema(additional, refs=refs, overrides=overrides), max_size=max_size
        )
        return st.tuples(fixed, extra).map(lambda pair: {**pair[1], **pair[0]})
    return fixed


# --- mutations -------------------------------------------------------------------------------


def _paths(value: JsonValue, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [path]
    if isinstance(value, dict):
        for key, child in value.items():
            found += _paths(child, (*path, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            found += _paths(child, (*path, index))
    return found


def _set(root: JsonValue, path: tuple[Any, ...], new: JsonValue) -> JsonValue:
    if not path:
        return new
    parent = root
    for part in path[:-1]:
        parent = parent[part]
    parent[path[-1]] = new
    return root


def _remove(root: JsonValue, path: tuple[Any, ...]) -> JsonValue:
    if not path:
        return root
    parent = root
    for part in path[:-1]:
        parent = parent[part]
    del parent[path[-1]]
    return root


def _deep(levels: int) -> JsonValue:
    value: JsonValue = "bottom"
    for _ in range(levels):
        value = {"d": value}
    return value


_BROKEN = st.one_of(
    _SCALARS,
    st.just([]),
    st.just({}),
    st.just("x" * 100_000),
    st.just({f"k{i}": "v" for i in range(200)}),
    st.just([{"key": "k", "operator": "Exists"}] * 100),
    st.just(_deep(200)),
    st.just("\x00\u202e\ufffd"),
)


@st.composite
def _mutation(draw: st.DrawFn, value: JsonValue) -> JsonValue:
    # Copies throughout: `_BROKEN`'s `st.just` values are one object shared by every
    # example, and a later step writing into one would change the strategy itself
    # (hypothesis then fails the test with "Inconsistent data generation").
    value = copy.deepcopy(value)
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(value)
        path = draw(st.sampled_from(paths))
        how = draw(st.sampled_from(["remove", "replace", "unknown"]))
        if how == "remove" and path:
            value = _remove(value, path)
        elif how == "unknown" and isinstance(_at(value, path), dict):
            key = draw(st.sampled_from(["unknownField", "x-extra", "", "spec", "$ref"]))
            _at(value, path)[key] = copy.deepcopy(draw(_BROKEN))
        else:
            value = _set(value, path, copy.deepcopy(draw(_BROKEN)))
    return value


def _at(root: JsonValue, path: tuple[Any, ...]) -> JsonValue:
    for part in path:
        root = root[part]
    return root


def mutated(strategy: st.SearchStrategy[JsonValue]) -> st.SearchStrategy[JsonValue]:
    """Values of `strategy` broken in 1 to 3 places."""
    return strategy.flatmap(_mutation)


def maybe_mutated(strategy: st.SearchStrategy[JsonValue]) -> st.SearchStrategy[JsonValue]:
    """As drawn, or mutated: about half each."""
    return st.one_of(strategy, mutated(strategy))
