"""CEL rules (`x-kubernetes-validations`) compiled and evaluated with cel-python.

The project uses standard CEL only: cel-python implements it, not Kubernetes' CEL
libraries (quantity(), URL, IP, extended strings). `duration()` of our pattern-checked
duration strings is standard. A rule that needs a non-standard function registers it in
`_FUNCTIONS`; none does today.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import celpy
from celpy.adapter import json_to_cel
from celpy.celparser import CELParseError
from celpy.evaluation import CELEvalError

from modelswap_api.errors import CrdError

_FUNCTIONS: dict[str, Any] = {}
_SELF_FIELD_RE = re.compile(r"\bself\.([A-Za-z_][A-Za-z0-9_]*)")

_ENV = celpy.Environment()


@dataclass(frozen=True)
class Rule:
    """One compiled `x-kubernetes-validations` entry."""

    rule: str
    message: str
    field_path: str
    reason: str
    program: Any = field(compare=False, repr=False)

    @property
    def is_transition_rule(self) -> bool:
        """A rule reading `oldSelf` runs only on updates, as in Kubernetes."""
        return "oldSelf" in self.rule

    @property
    def fields_read(self) -> tuple[str, ...]:
        """Direct child fields the rule reads (`self.idleAfter` → idleAfter)."""
        return tuple(dict.fromkeys(_SELF_FIELD_RE.findall(self.rule)))

    def holds(self, value: Any, old_value: Any = None) -> bool:
        """True when the rule holds for `value`; an evaluation error counts as a failure."""
        activation: dict[str, Any] = {"self": json_to_cel(value)}
        if self.is_transition_rule:
            activation["oldSelf"] = json_to_cel(old_value)
        try:
            result = self.program.evaluate(activation)
        except CELEvalError:
            return False
        if isinstance(result, CELEvalError):
            return False
        return bool(result)


def compile_rule(entry: Mapping[str, Any], where: str) -> Rule:
    """Compile one rule; CrdError naming the schema node when it does not compile."""
    text = entry.get("rule")
    if not isinstance(text, str) or not text:
        raise CrdError(f"{where}: x-kubernetes-validations entry without a rule")
    try:
        program = _ENV.program(_ENV.compile(text), functions=_FUNCTIONS)
    except CELParseError as e:
        raise CrdError(f"{where}: CEL rule {text!r} does not compile: {e}") from e
    return Rule(
        rule=text,
        message=str(entry.get("message") or f"failed rule: {text}"),
        field_path=str(entry.get("fieldPath", "")),
        reason=str(entry.get("reason", "FieldValueInvalid")),
        program=program,
    )
