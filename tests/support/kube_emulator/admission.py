"""What the server checks before a write: names, ObjectMeta fields, and custom objects'
schema + CEL through modelswap's validator, with `fieldValidation` deciding what an unknown
field does (Strict: 400, Warn: a `Warning` header, Ignore: pruned silently)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

from tests.support.kube_emulator.errors import bad_request, invalid
from tests.support.kube_emulator.resources import ResourceType

FieldValidation = Literal["Strict", "Warn", "Ignore"]

_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' "
    "or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex "
    f"used for validation is '{_SUBDOMAIN}')"
)
_LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
    "and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', "
    f"regex used for validation is '{_LABEL}')"
)
OBJECT_META_FIELDS = frozenset(
    {
        "name", "generateName", "namespace", "selfLink", "uid", "resourceVersion",
        "generation", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
        "labels", "annotations", "ownerReferences", "finalizers", "managedFields",
    }
)  # fmt: skip


@dataclass
class Admitted:
    object: dict[str, Any]
    warnings: list[str] = field(default_factory=list)


def parse_field_validation(value: str | None) -> FieldValidation:
    if value in (None, ""):
        # The real server's default is Warn since 1.27 (kubectl always sends its choice).
        return "Warn"
    if value not in ("Strict", "Warn", "Ignore"):
        raise bad_request(
            f'fieldValidation parameter unsupported: "{value}", valid values are: '
            f"Ignore, Warn, Strict"
        )
    return value  # type: ignore[return-value]


def _path_segment_problem(name: str) -> str | None:
    """RBAC objects' names need only be path segments (`system:discovery` is valid)."""
    if name in (".", ".."):
        return f"may not be '{name}'"
    for bad in ("/", "%"):
        if bad in name:
            return f"may not contain '{bad}'"
    return None


def check_name(rt: ResourceType, name: str) -> None:
    if rt.group == "rbac.authorization.k8s.io":
        problem = _path_segment_problem(name) if name else "name or generateName is required"
        if problem:
            raise invalid(
                rt.group,
                rt.kind,
                name,
                [("metadata.name", "FieldValueInvalid", f'Invalid value: "{name}": {problem}')],
            )
        return
    pattern, message, limit = (
        (_LABEL, _LABEL_MSG, 63) if rt.plural == "namespaces" else (_SUBDOMAIN, _SUBDOMAIN_MSG, 253)
    )
    problem = None
    if len(name) > limit:
        problem = f"must be no more than {limit} characters"
    elif not re.fullmatch(pattern, name):
        problem = message
    if problem:
        raise invalid(
            rt.group,
            rt.kind,
            name,
            [("metadata.name", "FieldValueInvalid", f'Invalid value: "{name}": {problem}')],
        )


def _unknown_meta_fields(obj: dict[str, Any]) -> list[str]:
    meta = obj.get("metadata") or {}
    return [f"metadata.{k}" for k in meta if k not in OBJECT_META_FIELDS]


def admit(
    rt: ResourceType,
    obj: dict[str, Any],
    *,
    field_validation: FieldValidation,
    old: dict[str, Any] | None,
    is_patch: bool,
) -> Admitted:
    """Validate a write; return the object to store (pruned and defaulted) and warnings."""
    unknown = _unknown_meta_fields(obj)
    for path in unknown:
        obj["metadata"].pop(path.split(".", 1)[1], None)
    result_obj = obj
    errors: list[tuple[str, str, str]] = []
    if rt.validator is not None:
        result = rt.validator.validate(obj, field_validation=field_validation, old=old)
        result_obj = result.object
        unknown += list(result.unknown_fields)
        errors = [(e.path, e.reason, e.message) for e in result.errors]
    warnings: list[str] = []
    if unknown and field_validation == "Strict":
        detail = ", ".join(f'unknown field "{p}"' for p in unknown)
        prefix = (
            ""
            if is_patch
            else f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: '
        )
        raise bad_request(f"{prefix}strict decoding error: {detail}")
    if unknown and field_validation == "Warn":
        warnings = [f'unknown field "{p}"' for p in unknown]
    if errors:
        raise invalid(rt.group, rt.kind, obj["metadata"].get("name", ""), errors)
    return Admitted(result_obj, warnings)
