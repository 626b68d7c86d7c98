"""CEL work in the validator is bounded before it runs (issue 12, deliverable 1): a schema
whose rules could run more than `MAX_CEL_EVALUATIONS` times on one object is refused when it
is compiled; an object that would make rules under an unbounded list run past the budget is
refused naming the limit, in bounded time, as kube-apiserver refuses past its cost budget."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from modelswap_api.errors import CrdError
from modelswap_api.validation import MAX_CEL_EVALUATIONS, SchemaValidator
from tests.support.reliability import record

CRDS = Path(__file__).resolve().parents[2] / "crds"


def list_schema(max_items: int | None) -> dict[str, Any]:
    item = {
        "type": "object",
        "properties": {"low": {"type": "integer"}, "high": {"type": "integer"}},
        "x-kubernetes-validations": [{"rule": "self.low <= self.high", "message": "low > high"}],
    }
    items: dict[str, Any] = {"type": "array", "items": item}
    if max_items is not None:
        items["maxItems"] = max_items
    return {
        "type": "object",
        "properties": {"spec": {"type": "object", "properties": {"items": items}}},
    }


@pytest.mark.parametrize("path", sorted(CRDS.glob("*.yaml")), ids=lambda p: p.name)
def test_our_crds_rules_have_a_bounded_worst_case_within_the_budget(path: Path) -> None:
    crd = yaml.safe_load(path.read_text())
    for version in crd["spec"]["versions"]:
        worst = SchemaValidator.from_crd(crd, version["name"]).cel_worst_case
        assert worst is not None and worst <= MAX_CEL_EVALUATIONS
    record("inputs", input=f"CEL rules of {path.name}", limit=f"MAX_CEL_EVALUATIONS ({MAX_CEL_EVALUATIONS})",
           outcome=f"worst case {worst} evaluations per object", answered_seconds=0.0)  # fmt: skip


def test_a_schema_whose_rules_could_run_past_the_budget_is_refused_when_compiled() -> None:
    with pytest.raises(CrdError, match=r"spec\.items\[\*\]: CEL rules could run 5000 times"):
        SchemaValidator(list_schema(5000))
    assert SchemaValidator(list_schema(100)).cel_worst_case == 100


def test_rules_under_an_unbounded_list_stop_at_the_budget_naming_it() -> None:
    validator = SchemaValidator(list_schema(None))
    assert validator.cel_worst_case is None
    items = [{"low": 1, "high": 2}] * (MAX_CEL_EVALUATIONS + 4000)
    started = time.monotonic()
    result = validator.validate({"apiVersion": "x/v1", "kind": "X", "spec": {"items": items}})
    seconds = time.monotonic() - started
    [error] = result.errors
    assert error.path == f"spec.items[{MAX_CEL_EVALUATIONS}]"
    assert "running out of cost budget" in error.message
    assert f"{MAX_CEL_EVALUATIONS} CEL evaluations" in error.message
    assert seconds < 5.0
    record(
        "inputs",
        input=f"an object whose rules would run {len(items)} times (a rule per list item)",
        limit=f"MAX_CEL_EVALUATIONS ({MAX_CEL_EVALUATIONS} per object)",
        outcome="refused naming the limit; no further rules run",
        answered_seconds=round(seconds, 3),
    )
    within = validator.validate({"apiVersion": "x/v1", "kind": "X", "spec": {"items": items[:10]}})
    assert within.ok
