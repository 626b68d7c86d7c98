"""Dict ⇄ frozen dataclass conversion with camelCase wire names.

Fields are snake_case in Python and camelCase on the wire (`weights_bytes` ⇄
`weightsBytes`); a field's metadata `wire=` overrides the derived name. Unknown keys are
refused with their path; unset optional fields are omitted on the way out, so a document
round-trips unchanged.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, TypeVar, Union, cast

from modelswap_api.errors import ModelError, QuantityError
from modelswap_api.field_errors import join_path
from modelswap_api.quantities import Duration, Quantity

T = TypeVar("T")


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def wire_name(f: dataclasses.Field[Any]) -> str:
    return str(f.metadata.get("wire", camel(f.name)))


@functools.cache
def _hints(cls: Any) -> dict[str, Any]:
    return typing.get_type_hints(cls)


@functools.cache
def _wire_fields(cls: Any) -> dict[str, dataclasses.Field[Any]]:
    """A dataclass's fields by wire name (computed once per class: read, never changed)."""
    return {wire_name(f): f for f in dataclasses.fields(cls)}


def from_dict(cls: type[T], data: Any, path: str = "") -> T:
    """Build dataclass `cls` from `data`; ModelError naming the path on any mismatch."""
    if not isinstance(data, Mapping):
        raise ModelError(path, f"expected an object, got {type(data).__name__}")
    hints = _hints(cast(Any, cls))
    fields = _wire_fields(cast(Any, cls))
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ModelError(join_path(path, unknown[0]), "unknown field")
    kwargs: dict[str, Any] = {}
    for key, f in fields.items():
        if key in data:
            kwargs[f.name] = _decode(hints[f.name], data[key], join_path(path, key))
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ModelError(join_path(path, key), "required field is missing")
    return cls(**kwargs)


def to_dict(obj: Any) -> dict[str, Any]:
    """The wire form of a dataclass; None fields are omitted."""
    out: dict[str, Any] = {}
    for key, f in _wire_fields(cast(Any, type(obj))).items():
        value = getattr(obj, f.name)
        if value is not None:
            out[key] = _encode(value)
    return out


def _encode(value: Any) -> Any:
    if isinstance(value, Quantity | Duration):
        return value.raw
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_dict(value)
    if isinstance(value, tuple | list):
        return [_encode(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _encode(v) for k, v in value.items()}
    return value


def _decode(hint: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None:
            return None
        if len(options) == 1:
            return _decode(options[0], value, path)
        return _decode_scalar_union(options, value, path)
    if hint is Any:
        return value
    if origin is Literal:
        allowed = typing.get_args(hint)
        if value not in allowed:
            supported = ", ".join(repr(a) for a in allowed)
            raise ModelError(path, f"unsupported value {value!r}; supported: {supported}")
        return value
    if origin is tuple:
        (item,) = (a for a in typing.get_args(hint) if a is not Ellipsis)
        if not isinstance(value, list):
            raise ModelError(path, f"expected a list, got {type(value).__name__}")
        return tuple(_decode(item, v, join_path(path, i)) for i, v in enumerate(value))
    if origin in (dict, Mapping):
        _, item = typing.get_args(hint)
        if not isinstance(value, Mapping):
            raise ModelError(path, f"expected an object, got {type(value).__name__}")
        return {k: _decode(item, v, join_path(path, k)) for k, v in value.items()}
    if hint in (Quantity, Duration):
        try:
            return hint(value)
        except (QuantityError, TypeError) as e:
            raise ModelError(path, str(e)) from e
    if dataclasses.is_dataclass(hint):
        return from_dict(hint, value, path)  # type: ignore[arg-type]
    return _decode_scalar_union([hint], value, path)


def _decode_scalar_union(options: list[Any], value: Any, path: str) -> Any:
    for option in options:
        if option is float and isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if option is int and isinstance(value, bool):
            continue
        if isinstance(option, type) and isinstance(value, option):
            return value
    names = " or ".join(getattr(o, "__name__", str(o)) for o in options)
    raise ModelError(path, f"expected {names}, got {type(value).__name__}")
