"""Validate one of our resources exactly as the cluster would on `kubectl apply`.

Adds to the schema validator what the API server checks around it: the apiVersion and kind
are served, `metadata.name` is a DNS subdomain, and unknown fields are refused (kubectl
sends `fieldValidation=Strict`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any

from modelswap_api import crds
from modelswap_api import field_errors as fe
from modelswap_api.errors import CrdError
from modelswap_api.field_errors import FieldError
from modelswap_api.validation import FieldValidation, SchemaValidator, ValidationResult

_DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_SUBDOMAIN_MAX = 253
#: The API server's cap on all of an object's annotations together (keys and values), bytes.
MAX_ANNOTATIONS_BYTES = 256 << 10


@functools.cache
def validator_for(kind: str) -> SchemaValidator:
    """The validator of one of our kinds (served version)."""
    return SchemaValidator.from_crd(crds.crd_for(kind), crds.VERSION)


def validate_resource(
    obj: Mapping[str, Any], *, field_validation: FieldValidation = "Strict"
) -> ValidationResult:
    """Every problem the API server would report for creating `obj`."""
    api_version = obj.get("apiVersion")
    kind = obj.get("kind")
    if api_version != crds.API_VERSION:
        shown = fe.show_value(api_version)
        message = f'Unsupported value: {shown}: supported values: "{crds.API_VERSION}"'
        return ValidationResult(dict(obj), (FieldError("apiVersion", fe.NOT_SUPPORTED, message),))
    try:
        validator = validator_for(str(kind))
    except CrdError as e:
        return ValidationResult(dict(obj), (FieldError("kind", fe.NOT_SUPPORTED, str(e)),))
    metadata_errors = _metadata_errors(obj.get("metadata"))
    if any(e.reason == fe.TOO_LONG for e in metadata_errors):
        return ValidationResult(dict(obj), tuple(metadata_errors))  # before the schema's work
    result = validator.validate(obj, field_validation=field_validation)
    errors = list(metadata_errors)
    if field_validation == "Strict":
        errors += [
            FieldError(path, fe.UNKNOWN, f'unknown field "{path}"')
            for path in result.unknown_fields
        ]
    return ValidationResult(result.object, (*errors, *result.errors), result.unknown_fields)


def _annotations_errors(annotations: Any) -> list[FieldError]:
    """At most `MAX_ANNOTATIONS_BYTES` in all, string keys and values (as the API server)."""
    if annotations is None:
        return []
    if not isinstance(annotations, dict):
        return [FieldError("metadata.annotations", fe.TYPE_INVALID, "must be a map of strings")]
    total = 0
    for key, value in annotations.items():
        if not isinstance(key, str) or not isinstance(value, str):
            message = "Invalid value: annotations are strings"
            return [FieldError("metadata.annotations", fe.TYPE_INVALID, message)]
        total += len(key.encode()) + len(value.encode())
        if total > MAX_ANNOTATIONS_BYTES:
            message = f"Too long: must have at most {MAX_ANNOTATIONS_BYTES} bytes"
            return [FieldError("metadata.annotations", fe.TOO_LONG, message)]
    return []


def _metadata_errors(metadata: Any) -> list[FieldError]:
    if not isinstance(metadata, dict):
        return [FieldError("metadata", fe.REQUIRED, "Required value")]
    annotations = _annotations_errors(metadata.get("annotations"))
    if annotations:
        return annotations
    name = metadata.get("name")
    if not name and not metadata.get("generateName"):
        return [
            FieldError(
                "metadata.name", fe.REQUIRED, "Required value: name or generateName is required"
            )
        ]
    if name and (
        not isinstance(name, str)
        or len(name) > _DNS_SUBDOMAIN_MAX
        or not _DNS_SUBDOMAIN_RE.match(name)
    ):
        return [
            FieldError(
                "metadata.name",
                fe.INVALID,
                f"Invalid value: {fe.show_value(name)}: a lowercase RFC 1123 subdomain must "
                "consist of lower case alphanumeric characters, '-' or '.', and must start "
                "and end with an alphanumeric character",
            )
        ]
    return []
