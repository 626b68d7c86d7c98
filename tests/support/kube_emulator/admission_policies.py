"""ValidatingAdmissionPolicy enforcement with cel-python, for writes made by requests.

What is evaluated (admissionregistration.k8s.io/v1, as stored in the emulator):
- policy `matchConstraints` and binding `matchResources`: resourceRules and
  excludeResourceRules (apiGroups, apiVersions, resources with `res/sub`, `*`, `res/*`,
  `*/*`, operations, scope, resourceNames), namespaceSelector and objectSelector
  (matchLabels, matchExpressions);
- operations CREATE, UPDATE (also patches and status writes) and DELETE (`object` null,
  `oldObject` the object; the garbage collector's and namespace cleanup's deletes skip it);
- `matchConditions`, `variables` (as `variables.<name>`), `validations` (expression,
  message, messageExpression, reason), `failurePolicy` (Fail, the default, or Ignore) for
  compile and runtime errors;
- binding `validationActions`: Deny refuses, Warn adds a `Warning` header, Audit is ignored;
- CEL variables `object` (null on DELETE), `oldObject` (null on CREATE), `request` (kind,
  resource, subResource, name, namespace, operation, userInfo with username/uid/groups/
  extra, dryRun), `namespaceObject`, and `params` (always null: paramKind/paramRef are not
  resolved).

Not evaluated: Kubernetes' CEL libraries (cel-python has standard CEL only: no
`authorizer`, `quantity()`, URL/IP, extended strings), type checking, CONNECT,
auditAnnotations, policy status.

A denial is answered as the apiserver's dispatcher does: 422 Invalid (or the code of the
validation's `reason`), message `<resource> "<name>" is forbidden: ValidatingAdmissionPolicy
'<policy>' with binding '<binding>' denied request: <message>`, the same text as the cause.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import celpy
from celpy.adapter import json_to_cel
from celpy.celparser import CELParseError
from celpy.evaluation import CELEvalError

from tests.support.kube_emulator.authn import UserInfo
from tests.support.kube_emulator.errors import ApiError
from tests.support.kube_emulator.resources import ResourceType
from tests.support.kube_emulator.store import Store

GROUP = "admissionregistration.k8s.io"
_POLICIES = (GROUP, "validatingadmissionpolicies")
_BINDINGS = (GROUP, "validatingadmissionpolicybindings")
_CODES = {"Forbidden": 403, "Unauthorized": 401, "RequestEntityTooLarge": 413, "Invalid": 422}


@functools.cache
def _environment() -> celpy.Environment:
    """One CEL environment, made on first use: building its parser takes a quarter second."""
    return celpy.Environment()


@dataclass(frozen=True)
class AdmissionRequest:
    rt: ResourceType
    operation: str  # CREATE | UPDATE | DELETE
    subresource: str
    name: str
    namespace: str
    object: dict[str, Any] | None  # null on DELETE
    old_object: dict[str, Any] | None  # null on CREATE
    user: UserInfo
    dry_run: bool

    def as_json(self) -> dict[str, Any]:
        rt = self.rt
        kind = {"group": rt.group, "version": rt.version, "kind": rt.kind}
        resource = {"group": rt.group, "version": rt.version, "resource": rt.plural}
        return {
            "kind": kind, "resource": resource, "subResource": self.subresource,
            "requestKind": kind, "requestResource": resource,
            "requestSubResource": self.subresource, "name": self.name,
            "namespace": self.namespace, "operation": self.operation,
            "userInfo": self.user.as_json(), "dryRun": self.dry_run,
        }  # fmt: skip


class _ExpressionError(Exception):
    """A CEL expression failed to compile or evaluate (failurePolicy decides)."""


@dataclass(frozen=True)
class _Denial:
    policy: str
    binding: str
    message: str
    reason: str


def labels_match(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    if not selector:
        return True  # absent or {} selects everything
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or ():
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or ()
        present = key in labels
        if op == "In" and not (present and labels[key] in values):
            return False
        if op == "NotIn" and present and labels[key] in values:
            return False
        if op == "Exists" and not present:
            return False
        if op == "DoesNotExist" and present:
            return False
    return True


def _one_of(values: Any, wanted: str) -> bool:
    return any(v in ("*", wanted) for v in values or ())


def rule_matches(rule: Mapping[str, Any], req: AdmissionRequest) -> bool:
    rt = req.rt
    if not _one_of(rule.get("operations"), req.operation):
        return False
    if not _one_of(rule.get("apiGroups"), rt.group):
        return False
    if not _one_of(rule.get("apiVersions"), rt.version):
        return False
    scope = rule.get("scope") or "*"
    if (scope == "Cluster" and rt.namespaced) or (scope == "Namespaced" and not rt.namespaced):
        return False
    names = rule.get("resourceNames") or ()
    if names and req.name not in names:
        return False
    for entry in rule.get("resources") or ():
        resource, _, sub = str(entry).partition("/")
        if resource in ("*", rt.plural) and sub in ("*", req.subresource):
            return True
    return False


class PolicyEvaluator:
    def __init__(self, store: Store) -> None:
        self._store = store
        self._programs: dict[str, Any] = {}

    def _matches(self, match: Mapping[str, Any], req: AdmissionRequest) -> bool:
        rules = match.get("resourceRules") or ()
        if not any(rule_matches(r, req) for r in rules):
            return False
        if any(rule_matches(r, req) for r in match.get("excludeResourceRules") or ()):
            return False
        objects = [o for o in (req.object, req.old_object) if o is not None]
        if not any(
            labels_match(match.get("objectSelector"), o["metadata"].get("labels") or {})
            for o in objects
        ):
            return False
        namespace_labels = self._namespace_labels(req)
        return namespace_labels is None or labels_match(
            match.get("namespaceSelector"), namespace_labels
        )

    def _namespace_labels(self, req: AdmissionRequest) -> dict[str, str] | None:
        if req.rt.key == ("", "namespaces"):
            namespace_obj = req.object or req.old_object or {}
            return dict(namespace_obj.get("metadata", {}).get("labels") or {})
        if not req.rt.namespaced:
            return None  # a namespaceSelector does not exclude cluster-scoped objects
        namespace = self._store.get(("", "namespaces"), "", req.namespace)
        return dict(((namespace or {}).get("metadata") or {}).get("labels") or {})

    def _evaluate(self, expression: str, activation: dict[str, Any]) -> Any:
        program = self._programs.get(expression)
        if program is None:
            try:
                env = _environment()
                program = env.program(env.compile(expression))
            except CELParseError as e:
                raise _ExpressionError(f"compilation failed: {e}") from e
            self._programs[expression] = program
        try:
            result = program.evaluate(activation)
        except CELEvalError as e:
            raise _ExpressionError(str(e.args[0] if e.args else e)) from e
        if isinstance(result, CELEvalError):
            raise _ExpressionError(str(result.args[0] if result.args else result))
        return result

    def _activation(self, req: AdmissionRequest, spec: Mapping[str, Any]) -> dict[str, Any]:
        namespace_object = None
        if req.rt.namespaced:
            namespace_object = self._store.get(("", "namespaces"), "", req.namespace)
        activation: dict[str, Any] = {
            "object": json_to_cel(req.object),
            "oldObject": json_to_cel(req.old_object),
            "request": json_to_cel(req.as_json()),
            "params": json_to_cel(None),
            "namespaceObject": json_to_cel(namespace_object),
        }
        variables: dict[str, Any] = {}
        for variable in spec.get("variables") or ():
            activation["variables"] = json_to_cel(variables)
            try:
                value = self._evaluate(variable["expression"], activation)
            except _ExpressionError:
                continue  # an expression using it then fails, as a lazy variable would
            variables[variable["name"]] = value
        activation["variables"] = celpy.celtypes.MapType(
            {celpy.celtypes.StringType(k): v for k, v in variables.items()}
        )
        return activation

    def _check(
        self, policy: dict[str, Any], binding: dict[str, Any], req: AdmissionRequest
    ) -> _Denial | None:
        """The first failed validation of one policy under one binding, or None."""
        spec = policy.get("spec") or {}
        policy_name = policy["metadata"]["name"]
        binding_name = binding["metadata"]["name"]
        fail = (spec.get("failurePolicy") or "Fail") == "Fail"
        activation = self._activation(req, spec)
        for condition in spec.get("matchConditions") or ():
            try:
                if not bool(self._evaluate(condition["expression"], activation)):
                    return None
            except _ExpressionError as e:
                if not fail:
                    return None
                message = f"expression '{condition['expression']}' resulted in error: {e}"
                return _Denial(policy_name, binding_name, message, "")
        for validation in spec.get("validations") or ():
            expression = str(validation.get("expression", ""))
            try:
                if bool(self._evaluate(expression, activation)):
                    continue
            except _ExpressionError as e:
                if not fail:
                    continue
                message = f"expression '{expression}' resulted in error: {e}"
                return _Denial(policy_name, binding_name, message, "")
            message = str(validation.get("message") or "")
            if validation.get("messageExpression"):
                # On an error the static message (or the default) stands.
                with contextlib.suppress(_ExpressionError):
                    message = str(self._evaluate(validation["messageExpression"], activation))
            if not message.strip():
                message = f"failed expression: {expression.strip()}"
            return _Denial(policy_name, binding_name, message, str(validation.get("reason") or ""))
        return None

    def validate(self, req: AdmissionRequest) -> list[str]:
        """Warnings to return; raises the apiserver's ApiError when a Deny binding fails."""
        warnings: list[str] = []
        bindings = sorted(self._store.items(_BINDINGS), key=lambda b: b["metadata"]["name"])
        policies = {p["metadata"]["name"]: p for p in self._store.items(_POLICIES)}
        for binding in bindings:
            spec = binding.get("spec") or {}
            policy = policies.get(spec.get("policyName", ""))
            if policy is None:
                continue  # a binding naming no existing policy is ignored
            constraints = (policy.get("spec") or {}).get("matchConstraints")
            if not constraints or not self._matches(constraints, req):
                continue
            if spec.get("matchResources") and not self._matches(spec["matchResources"], req):
                continue
            denial = self._check(policy, binding, req)
            if denial is None:
                continue
            actions = spec.get("validationActions") or ()
            if "Warn" in actions:
                warnings.append(
                    f"Validation failed for ValidatingAdmissionPolicy '{denial.policy}' with "
                    f"binding '{denial.binding}': {denial.message}"
                )
            if "Deny" in actions:
                raise _denied(req, denial)
        return warnings


def _denied(req: AdmissionRequest, denial: _Denial) -> ApiError:
    rt = req.rt
    message = (
        f"ValidatingAdmissionPolicy '{denial.policy}' with binding '{denial.binding}' denied "
        f"request: {denial.message}"
    )
    reason = denial.reason or "Invalid"
    details: dict[str, Any] = {
        "name": req.name,
        "kind": rt.plural,
        "causes": [{"message": message}],
    }
    if rt.group:
        details["group"] = rt.group
    return ApiError(
        _CODES.get(reason, 422),
        f'{rt.group_resource} "{req.name}" is forbidden: {message}',
        reason=reason,
        details=details,
    )
