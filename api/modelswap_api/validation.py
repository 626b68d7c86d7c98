"""The one validator: checks an object against a CRD's schema as the API server does.

First a structural pre-check (`bounds_errors`): every `maxProperties`, `maxItems` and
`maxLength` of the schema, checked by counting before anything walks the object, so an
oversized map or list (400,000 `nodeSelector` entries) is refused at once naming its field,
never handed to jsonschema and CEL. An object with such a map or list gets only those
errors; one with only strings too long goes on to the full check, which reports them with
every other problem.

Then, as in kube-apiserver: prune unknown fields (reporting them, so callers can refuse
them under `fieldValidation=Strict`), apply schema defaults, check the OpenAPI schema
(jsonschema, with Kubernetes' int-or-string and nullable), then run the CEL rules of every
node whose subtree passed the schema checks. Root `apiVersion`, `kind` and `metadata` pass
through: ObjectMeta is the API machinery's business, not the CRD schema's.

CEL work is bounded before anything runs, as kube-apiserver bounds its cost: a schema whose
rules could run more than `MAX_CEL_EVALUATIONS` times on one object (a rule inside a list
or map runs once per item, up to its `maxItems`/`maxProperties`; one without a bound makes
the worst case unknown, `cel_worst_case` None) is refused when it is compiled, naming the
node; a string a rule reads is within its `maxLength` where it has one (a subtree with a
schema error is not given to CEL). Evaluations are also counted per object, and past the
budget the rest are not run and the object is refused, naming the limit, as the API server
does.

Used by `modelswap validate`, local mode, the operator's tests and the API emulator.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import jsonschema

from modelswap_api import field_errors as fe
from modelswap_api.cel import Rule, compile_rule
from modelswap_api.crds import version_of
from modelswap_api.errors import CrdError
from modelswap_api.field_errors import FieldError, join_path, show_value

FieldValidation = Literal["Strict", "Warn", "Ignore"]

_ROOT_PASSTHROUGH = frozenset({"apiVersion", "kind", "metadata"})
_RFC3339_RE = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")
_INT_FORMAT_BOUNDS = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}
# Keywords with the same meaning in OpenAPI 3.0 schemas and JSON Schema draft 4.
_KEPT_KEYWORDS = frozenset(
    {
        "type", "enum", "pattern", "minimum", "maximum", "exclusiveMinimum",
        "exclusiveMaximum", "minLength", "maxLength", "minItems", "maxItems",
        "minProperties", "maxProperties", "uniqueItems", "multipleOf", "format", "required",
    }
)  # fmt: skip


@dataclass(frozen=True)
class ValidationResult:
    """`object` is the pruned and defaulted copy; `unknown_fields` were pruned from it."""

    object: dict[str, Any]
    errors: tuple[FieldError, ...] = ()
    unknown_fields: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.errors


@dataclass
class _Node:
    """One schema node with what pruning, defaulting and CEL need, compiled once."""

    properties: dict[str, _Node] = field(default_factory=dict)
    items: _Node | None = None
    additional: _Node | None = None
    additional_any: bool = False
    preserve_unknown: bool = False
    is_object: bool = False
    has_default: bool = False
    default: Any = None
    rules: tuple[Rule, ...] = ()
    max_properties: int | None = None
    max_items: int | None = None
    max_length: int | None = None


#: At most this many bound errors are reported per object (the first ones found).
MAX_BOUND_ERRORS = 16
#: Most CEL rule evaluations on one object (the ModelDeployment schema's worst case is 36:
#: one rule per toleration, 32 at most, and four others).
MAX_CEL_EVALUATIONS = 1_000


def bounds_errors(node: _Node, value: Any) -> list[FieldError]:
    """Every `maxProperties`/`maxItems`/`maxLength` the schema sets, checked by counting
    (a container over its bound is not walked further; unknown fields are not walked)."""
    errors: list[FieldError] = []
    _bounds(node, value, "", errors)
    return errors


def _bounds(node: _Node, value: Any, path: str, errors: list[FieldError]) -> None:
    if len(errors) >= MAX_BOUND_ERRORS:
        return
    if isinstance(value, Mapping):
        if node.max_properties is not None and len(value) > node.max_properties:
            message = f"Too many: {len(value)}: must have at most {node.max_properties} properties"
            errors.append(FieldError(path, fe.TOO_MANY, message))
            return
        for key, child in value.items():
            sub = node.properties.get(key) if isinstance(key, str) else None
            if sub is None:
                sub = node.additional
            if sub is not None:
                _bounds(sub, child, join_path(path, str(key)), errors)
    elif isinstance(value, list):
        if node.max_items is not None and len(value) > node.max_items:
            message = f"Too many: {len(value)}: must have at most {node.max_items} items"
            errors.append(FieldError(path, fe.TOO_MANY, message))
            return
        if node.items is not None:
            for index, item in enumerate(value):
                _bounds(node.items, item, join_path(path, index), errors)
    elif isinstance(value, str) and node.max_length is not None and len(value) > node.max_length:
        message = f"Too long: may not be more than {node.max_length} bytes"
        errors.append(FieldError(path, fe.TOO_LONG, message))


def _compile_node(schema: Mapping[str, Any], where: str) -> _Node:
    node = _Node(
        is_object=schema.get("type") == "object" or "properties" in schema,
        preserve_unknown=bool(schema.get("x-kubernetes-preserve-unknown-fields")),
        has_default="default" in schema,
        default=schema.get("default"),
        rules=tuple(
            compile_rule(entry, where) for entry in schema.get("x-kubernetes-validations", ())
        ),
        max_properties=schema.get("maxProperties"),
        max_items=schema.get("maxItems"),
        max_length=schema.get("maxLength"),
    )
    for name, child in schema.get("properties", {}).items():
        node.properties[name] = _compile_node(child, join_path(where, name))
    if "items" in schema:
        node.items = _compile_node(schema["items"], f"{where}[*]")
    additional = schema.get("additionalProperties")
    if isinstance(additional, Mapping):
        node.additional = _compile_node(additional, f"{where}[*]")
    elif additional is True:
        node.additional_any = True
    return node


def to_json_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A Kubernetes structural schema as JSON Schema draft 4 (int-or-string, nullable)."""
    out: dict[str, Any] = {k: v for k, v in schema.items() if k in _KEPT_KEYWORDS}
    if schema.get("x-kubernetes-int-or-string"):
        out["type"] = ["integer", "string"]
    if schema.get("nullable") and "type" in out:
        types = out["type"] if isinstance(out["type"], list) else [out["type"]]
        out["type"] = [*types, "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    if "properties" in schema:
        out["properties"] = {k: to_json_schema(v) for k, v in schema["properties"].items()}
    if "items" in schema:
        out["items"] = to_json_schema(schema["items"])
    additional = schema.get("additionalProperties")
    if isinstance(additional, Mapping):
        out["additionalProperties"] = to_json_schema(additional)
    for key in ("allOf", "anyOf", "oneOf"):
        if key in schema:
            out[key] = [to_json_schema(s) for s in schema[key]]
    if "not" in schema:
        out["not"] = to_json_schema(schema["not"])
    return out


def _format_checker() -> jsonschema.FormatChecker:
    checker = jsonschema.FormatChecker(formats=())

    @checker.checks("date-time")
    def _date_time(value: object) -> bool:
        return not isinstance(value, str) or bool(_RFC3339_RE.match(value))

    for name, (low, high) in _INT_FORMAT_BOUNDS.items():

        def _in_range(value: object, low: int = low, high: int = high) -> bool:
            return not isinstance(value, int) or low <= value <= high

        checker.checks(name)(_in_range)
    return checker


class SchemaValidator:
    """Validates objects of one CRD version."""

    def __init__(self, schema: Mapping[str, Any], *, kind: str = "object") -> None:
        self.kind = kind
        self._root = _compile_node(schema, "")
        self.cel_worst_case = _cel_worst_case(self._root, "")
        json_schema = to_json_schema(schema)
        jsonschema.Draft4Validator.check_schema(json_schema)
        self._schema_validator = jsonschema.Draft4Validator(
            json_schema, format_checker=_format_checker()
        )

    @classmethod
    def from_crd(cls, crd: Mapping[str, Any], version: str) -> SchemaValidator:
        entry = version_of(crd, version)
        try:
            schema = entry["schema"]["openAPIV3Schema"]
        except KeyError as e:
            raise CrdError(f"{crd['metadata']['name']} {version} has no openAPIV3Schema") from e
        return cls(schema, kind=crd["spec"]["names"]["kind"])

    def validate(
        self,
        obj: Mapping[str, Any],
        *,
        field_validation: FieldValidation = "Strict",
        old: Mapping[str, Any] | None = None,
    ) -> ValidationResult:
        """Validate a copy of `obj`; unknown fields are pruned from it and reported.

        `field_validation` is accepted for symmetry with the API server: the result always
        lists unknown fields, and callers refuse (Strict), warn (Warn) or ignore them.
        """
        del field_validation  # the caller acts on `unknown_fields`
        oversized = bounds_errors(self._root, obj)
        if len(oversized) >= MAX_BOUND_ERRORS or any(e.reason == fe.TOO_MANY for e in oversized):
            # a map or list over its bound is not walked; a string too long alone is cheap
            # to check, and the full check below reports it with every other problem
            return ValidationResult(object=dict(obj), errors=tuple(oversized))
        value = copy.deepcopy(dict(obj))
        unknown: list[str] = []
        _prune(self._root, value, "", unknown, at_root=True)
        _apply_defaults(self._root, value, at_root=True)
        errors = sorted(set(self._schema_errors(value)))
        failed_paths = [e.path for e in errors]
        budget = _CelBudget(MAX_CEL_EVALUATIONS)
        cel_errors = list(
            _cel_errors(
                self._root, value, dict(old) if old else None, "", failed_paths, budget=budget
            )
        )
        return ValidationResult(
            object=value,
            errors=tuple(errors + cel_errors),
            unknown_fields=tuple(unknown),
        )

    def _schema_errors(self, value: dict[str, Any]) -> Iterator[FieldError]:
        for error in self._schema_validator.iter_errors(value):
            path = ""
            for part in error.absolute_path:
                path = join_path(path, part)
            yield from _translate(error, path)


def _translate(error: jsonschema.ValidationError, path: str) -> Iterator[FieldError]:
    """A jsonschema error worded as kube-apiserver words the same problem."""
    kind = str(error.validator)
    expected: Any = error.validator_value
    value: Any = error.instance
    shown = show_value(value)
    if kind == "required":
        for name in expected:
            if isinstance(value, dict) and name not in value:
                yield FieldError(join_path(path, name), fe.REQUIRED, "Required value")
        return
    if kind == "type":
        wanted = " or ".join(t for t in (expected if isinstance(expected, list) else [expected]))
        actual = _json_type(value)
        message = f'Invalid value: "{actual}": {path} in body must be of type {wanted}: "{actual}"'
        yield FieldError(path, fe.TYPE_INVALID, message)
        return
    if kind == "enum":
        supported = ", ".join(show_value(v) for v in expected)
        yield FieldError(
            path, fe.NOT_SUPPORTED, f"Unsupported value: {shown}: supported values: {supported}"
        )
        return
    if kind in ("maxLength",):
        yield FieldError(path, fe.TOO_LONG, f"Too long: may not be more than {expected} bytes")
        return
    if kind in ("maxItems", "maxProperties"):
        count = len(value) if isinstance(value, list | dict) else 0
        what = "items" if kind == "maxItems" else "properties"
        yield FieldError(
            path, fe.TOO_MANY, f"Too many: {count}: must have at most {expected} {what}"
        )
        return
    detail = {
        "pattern": f"{path} in body should match '{expected}'",
        "minimum": f"{path} in body should be greater than or equal to {expected}",
        "maximum": f"{path} in body should be less than or equal to {expected}",
        "minLength": f"{path} in body should be at least {expected} chars long",
        "minItems": f"{path} in body should have at least {expected} items",
        "format": f"{path} in body must be of type {expected}: {shown}",
    }.get(kind, error.message)
    yield FieldError(path, fe.INVALID, f"Invalid value: {shown}: {detail}")


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _prune(node: _Node, value: Any, path: str, unknown: list[str], *, at_root: bool) -> None:
    if isinstance(value, list) and node.items is not None:
        for index, item in enumerate(value):
            _prune(node.items, item, join_path(path, index), unknown, at_root=False)
        return
    if not isinstance(value, dict) or not node.is_object:
        return
    for key in list(value):
        child_path = join_path(path, key)
        if at_root and key == "metadata":
            continue
        if key in node.properties:
            _prune(node.properties[key], value[key], child_path, unknown, at_root=False)
        elif node.additional is not None:
            _prune(node.additional, value[key], child_path, unknown, at_root=False)
        elif node.additional_any or node.preserve_unknown or (at_root and key in _ROOT_PASSTHROUGH):
            continue
        else:
            unknown.append(child_path)
            del value[key]


def _apply_defaults(node: _Node, value: Any, *, at_root: bool = False) -> None:
    if isinstance(value, list) and node.items is not None:
        for item in value:
            _apply_defaults(node.items, item)
        return
    if not isinstance(value, dict):
        return
    for key, child in node.properties.items():
        if at_root and key == "metadata":
            continue
        if key not in value and child.has_default:
            value[key] = copy.deepcopy(child.default)
        if key in value:
            _apply_defaults(child, value[key])
    if node.additional is not None:
        for item in value.values():
            _apply_defaults(node.additional, item)


def _subtree_failed(path: str, failed_paths: list[str]) -> bool:
    if not path:
        return bool(failed_paths)
    return any(p == path or p.startswith((f"{path}.", f"{path}[")) for p in failed_paths)


class _CelBudget:
    """Evaluations left for one object; the first refusal past it is reported once."""

    def __init__(self, evaluations: int) -> None:
        self.left = evaluations
        self.exhausted = False

    def spend(self) -> bool:
        self.left -= 1
        return self.left >= 0


def _cel_worst_case(node: _Node, where: str, times: int = 1) -> int | None:
    """Most rule evaluations one object can cost (`times`: how often `node` can occur);
    None when a rule sits under a list or map without a bound (the per-object budget still
    holds); CrdError when the total passes `MAX_CEL_EVALUATIONS`."""
    total: int | None = times * len(node.rules)
    children: list[tuple[_Node, str, int | None]] = [
        (child, join_path(where, name), 1) for name, child in node.properties.items()
    ]
    if node.items is not None:
        children.append((node.items, f"{where}[*]", node.max_items))
    if node.additional is not None:
        children.append((node.additional, f"{where}[*]", node.max_properties))
    for child, child_where, bound in children:
        if bound is None:
            if _has_rules(child):
                total = None
            continue
        below = _cel_worst_case(child, child_where, times * bound)
        total = None if total is None or below is None else total + below
    if total is not None and total > MAX_CEL_EVALUATIONS:
        raise CrdError(
            f"{where or '<root>'}: CEL rules could run {total} times on one object, over the "
            f"limit of {MAX_CEL_EVALUATIONS} (MAX_CEL_EVALUATIONS)"
        )
    return total


def _has_rules(node: _Node) -> bool:
    children = [*node.properties.values(), node.items, node.additional]
    return bool(node.rules) or any(c is not None and _has_rules(c) for c in children)


def _cel_errors(
    node: _Node, value: Any, old: Any, path: str, failed_paths: list[str], *, budget: _CelBudget
) -> Iterator[FieldError]:
    if value is None or budget.exhausted:
        return
    if node.rules and not _subtree_failed(path, failed_paths):
        for rule in node.rules:
            if rule.is_transition_rule and old is None:
                continue
            if not budget.spend():
                budget.exhausted = True
                yield FieldError(
                    path,
                    fe.INVALID,
                    "Invalid value: validation failed due to running out of cost budget "
                    f"({MAX_CEL_EVALUATIONS} CEL evaluations per object), no further "
                    "validation rules will be run",
                )
                return
            if not rule.holds(value, old):
                where = (
                    path + rule.field_path
                    if rule.field_path.startswith("[")
                    else (join_path(path, rule.field_path.lstrip(".")) if rule.field_path else path)
                )
                yield FieldError(
                    where, rule.reason, f"Invalid value: {show_value(value)}: {rule.message}"
                )
    if isinstance(value, dict):
        old_map = old if isinstance(old, dict) else {}
        for key, child in node.properties.items():
            if key in value:
                yield from _cel_errors(
                    child,
                    value[key],
                    old_map.get(key),
                    join_path(path, key),
                    failed_paths,
                    budget=budget,
                )
        if node.additional is not None:
            for key, item in value.items():
                yield from _cel_errors(
                    node.additional,
                    item,
                    old_map.get(key),
                    join_path(path, key),
                    failed_paths,
                    budget=budget,
                )
    elif isinstance(value, list) and node.items is not None:
        for index, item in enumerate(value):
            yield from _cel_errors(
                node.items, item, None, join_path(path, index), failed_paths, budget=budget
            )
