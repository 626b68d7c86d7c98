"""A CEL rule remembers its verdicts by canonical JSON: the same value (in any key order)
costs one evaluation, a different value or oldSelf is evaluated, the memory is bounded,
and a value that is not JSON is never remembered."""

from __future__ import annotations

from typing import Any

import pytest

from modelswap_api import cel


class CountingProgram:
    def __init__(self, program: Any) -> None:
        self.program = program
        self.calls = 0

    def evaluate(self, activation: dict[str, Any]) -> Any:
        self.calls += 1
        return self.program.evaluate(activation)


def counted(rule_text: str) -> tuple[cel.Rule, CountingProgram]:
    rule = cel.compile_rule({"rule": rule_text}, "spec")
    program = CountingProgram(rule.program)
    object.__setattr__(rule, "program", program)
    return rule, program


def test_the_same_value_is_evaluated_once_in_any_key_order() -> None:
    rule, program = counted("!has(self.a) || self.a < self.b")
    assert rule.holds({"a": 1, "b": 2})
    assert rule.holds({"b": 2, "a": 1})
    assert program.calls == 1
    assert not rule.holds({"a": 3, "b": 2})
    assert not rule.holds({"a": 3, "b": 2})
    assert program.calls == 2
    assert rule.holds({"a": 1.0, "b": 2})  # 1.0 is not 1 on the wire: evaluated apart
    assert program.calls == 3


def test_a_transition_rule_is_remembered_per_old_value() -> None:
    rule, program = counted("self.x >= oldSelf.x")
    assert rule.holds({"x": 2}, {"x": 1})
    assert not rule.holds({"x": 2}, {"x": 3})
    assert rule.holds({"x": 2}, {"x": 1})
    assert program.calls == 2


def test_the_memory_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cel, "VERDICT_MEMORY", 3)
    rule, program = counted("self.n > 0")
    for n in range(5):
        assert rule.holds({"n": n + 1})
    assert len(rule._verdicts) == 3
    rule.holds({"n": 1})  # dropped first: evaluated again
    assert program.calls == 6


def test_a_value_that_is_not_json_is_not_remembered_and_fails_as_before() -> None:
    rule, _program = counted("size(self.s) > 0")
    value = {"s": "x", "raw": b"\x00"}  # not JSON: cel-python's adapter refuses it too
    for _ in range(2):
        with pytest.raises(ValueError, match="unexpected type"):
            rule.holds(value)
    assert rule._verdicts == {}
