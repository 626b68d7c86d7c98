"""CEL rules (`x-kubernetes-validations`) compiled and evaluated with cel-python.

The project uses standard CEL only: cel-python implements it, not Kubernetes' CEL
libraries (quantity(), URL, IP, extended strings). `duration()` of our pattern-checked
duration strings is standard. A rule that needs a non-standard function registers it in
`_FUNCTIONS`; none does today.

A rule is a pure function of the value it sits on (and `oldSelf`), and cel-python's
interpreter takes milliseconds per evaluation, so each rule remembers its verdicts for the
last `VERDICT_MEMORY` values (keyed by canonical JSON): an object written again with the
same spec (a status update, a re-pushed desired set) costs no evaluation.
"""

from __future__ import annotations

import json
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
#: Verdicts each rule remembers (oldest dropped first).
VERDICT_MEMORY = 4096


@dataclass(frozen=True)
class Rule:
    """One compiled `x-kubernetes-validations` entry."""

    rule: str
    message: str
    field_path: str
    reason: str
    program: Any = field(compare=False, repr=False)
    _verdicts: dict[str, bool] = field(default_factory=dict, compare=False, repr=False)

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
        key = _memo_key(value, old_value if self.is_transition_rule else None)
        if key is None:
            return self._evaluate(value, old_value)
        verdict = self._verdicts.get(key)
        if verdict is None:
            verdict = self._evaluate(value, old_value)
            if len(self._verdicts) >= VERDICT_MEMORY:
                del self._verdicts[next(iter(self._verdicts))]
            self._verdicts[key] = verdict
        return verdict

    def _evaluate(self, value: Any, old_value: Any) -> bool:
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


def _memo_key(value: Any, old_value: Any) -> str | None:
    """Canonical JSON of the inputs; None when they are not JSON (not remembered)."""
    try:
        return json.dumps([value, old_value], sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError):
        return None


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
