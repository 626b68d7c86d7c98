"""One problem with one field, worded as the Kubernetes API server words it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

# `reason` values of a Kubernetes Status cause (k8s.io/apimachinery field errors).
REQUIRED = "FieldValueRequired"
INVALID = "FieldValueInvalid"
TYPE_INVALID = "FieldValueTypeInvalid"
NOT_SUPPORTED = "FieldValueNotSupported"
TOO_LONG = "FieldValueTooLong"
TOO_MANY = "FieldValueTooMany"
FORBIDDEN = "FieldValueForbidden"
UNKNOWN = "FieldValueUnknown"


@dataclass(frozen=True, order=True)
class FieldError:
    """A field path such as `spec.tolerations[0].key`, a Status cause reason, a message."""

    path: str
    reason: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


def show_value(value: Any) -> str:
    """A value as the API server quotes it in messages (JSON, strings quoted)."""
    if isinstance(value, dict):
        return '"object"'
    if isinstance(value, list):
        return '"array"'
    return json.dumps(value)


def join_path(parent: str, child: str | int) -> str:
    """`spec` + `model` → `spec.model`; `spec.items` + 3 → `spec.items[3]`."""
    if isinstance(child, int):
        return f"{parent}[{child}]"
    return f"{parent}.{child}" if parent else child
