"""JSON merge patch (RFC 7386), JSON patch (RFC 6902) and strategic merge patch.

Strategic merge covers what kubectl's three-way patches for built-in types use: list merge by
key (from the resource type's merge keys), `$patch: replace|delete`, `$retainKeys`,
`$deleteFromPrimitiveList/…` and `$setElementOrder/…` (order hints, dropped). Lists without a
known merge key are replaced, as for fields without a patch strategy.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from tests.support.kube_emulator.errors import ApiError, bad_request

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
# Lists of strings the built-in types merge as sets.
_PRIMITIVE_MERGE_LISTS = frozenset({"finalizers"})


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def _resolve(doc: Any, pointer: str) -> tuple[Any, str | int]:
    """The container of the pointed-at location and the key within it."""
    if not pointer.startswith("/"):
        raise bad_request(f"invalid JSON pointer: {pointer!r}")
    parts = [_unescape(p) for p in pointer[1:].split("/")]
    node = doc
    for part in parts[:-1]:
        node = _child(node, part, pointer)
    last = parts[-1]
    if isinstance(node, list):
        if last == "-":
            return node, len(node)
        if not last.isdigit():
            raise _unprocessable(f"invalid array index {last!r} in {pointer}")
        return node, int(last)
    if not isinstance(node, dict):
        raise _unprocessable(f"path {pointer} does not point into an object or array")
    return node, last


def _child(node: Any, part: str, pointer: str) -> Any:
    if isinstance(node, dict) and part in node:
        return node[part]
    if isinstance(node, list) and part.isdigit() and int(part) < len(node):
        return node[int(part)]
    raise _unprocessable(f"doc is missing path: {pointer!r}: missing value")


def _unprocessable(message: str) -> ApiError:
    return ApiError(422, message, reason="Invalid")


def _get(doc: Any, pointer: str) -> Any:
    if pointer == "":
        return doc
    parent, key = _resolve(doc, pointer)
    try:
        return parent[key]
    except (KeyError, IndexError):
        raise _unprocessable(f"doc is missing path: {pointer!r}: missing value") from None


def _remove(doc: Any, pointer: str) -> Any:
    parent, key = _resolve(doc, pointer)
    try:
        return parent.pop(key)
    except (KeyError, IndexError):
        raise _unprocessable(f"doc is missing path: {pointer!r}: missing value") from None


def _add(doc: Any, pointer: str, value: Any) -> Any:
    if pointer == "":
        return value
    parent, key = _resolve(doc, pointer)
    if isinstance(parent, list):
        assert isinstance(key, int)
        if key > len(parent):
            raise _unprocessable(f"index out of bounds in {pointer}")
        parent.insert(key, value)
    else:
        parent[key] = value
    return doc


def json_patch(target: Any, operations: Any) -> Any:
    if not isinstance(operations, list):
        raise bad_request("json patch must be a list of operations")
    doc = copy.deepcopy(target)
    for op in operations:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise bad_request(f"invalid json patch operation: {op!r}")
        kind, path = op["op"], op["path"]
        if kind == "add":
            doc = _add(doc, path, copy.deepcopy(op.get("value")))
        elif kind == "remove":
            _remove(doc, path)
        elif kind == "replace":
            _get(doc, path)
            if path == "":
                doc = copy.deepcopy(op.get("value"))
            else:
                parent, key = _resolve(doc, path)
                parent[key] = copy.deepcopy(op.get("value"))
        elif kind == "move":
            value = _remove(doc, op["from"])
            doc = _add(doc, path, value)
        elif kind == "copy":
            doc = _add(doc, path, copy.deepcopy(_get(doc, op["from"])))
        elif kind == "test":
            if _get(doc, path) != op.get("value"):
                raise _unprocessable(f"testing value {path} failed: test failed")
        else:
            raise bad_request(f"unexpected json patch operation {kind!r}")
    return doc


def strategic_merge_patch(target: Any, patch: Any, merge_keys: Mapping[str, str]) -> Any:
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if patch.get("$patch") == "delete":
        return None
    result = dict(target) if isinstance(target, Mapping) else {}
    retain = patch.get("$retainKeys")
    for key, value in patch.items():
        if key.startswith("$setElementOrder/") or key in ("$retainKeys", "$patch"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            name = key.split("/", 1)[1]
            result[name] = [v for v in result.get(name) or [] if v not in value]
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and isinstance(result.get(key), list):
            result[key] = _merge_list(key, result[key], value, merge_keys)
        else:
            result[key] = strategic_merge_patch(result.get(key), value, merge_keys)
    if isinstance(retain, list):
        result = {k: v for k, v in result.items() if k in retain}
    return result


def _merge_list(name: str, current: list[Any], patch: list[Any], keys: Mapping[str, str]) -> Any:
    if name in _PRIMITIVE_MERGE_LISTS:
        return current + [v for v in patch if v not in current]
    key = keys.get(name)
    if key is None:
        return copy.deepcopy(patch)
    if any(isinstance(v, Mapping) and v.get("$patch") == "replace" for v in patch):
        return [copy.deepcopy(v) for v in patch if not isinstance(v, Mapping) or "$patch" not in v]
    merged = [copy.deepcopy(v) for v in current]
    for item in patch:
        if not isinstance(item, Mapping):
            merged.append(copy.deepcopy(item))
            continue
        index = next(
            (
                i
                for i, v in enumerate(merged)
                if isinstance(v, Mapping) and v.get(key) == item.get(key)
            ),
            None,
        )
        if item.get("$patch") == "delete":
            if index is not None:
                merged.pop(index)
        elif index is None:
            merged.append(strategic_merge_patch({}, item, keys))
        else:
            merged[index] = strategic_merge_patch(merged[index], item, keys)
    return merged
