"""`parse_desired_set` remembers its verdicts per spec and per policy: a node's unchanged
set, pushed every grace/3, costs no schema or CEL evaluation the second time; a refused
spec stays refused; a large spec is never remembered."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from modelswap_api import control
from modelswap_api.defaults import BUILTIN_DEFAULTS
from modelswap_api.errors import ResourceError
from modelswap_api.policy import effective_policy
from modelswap_api.validation import SchemaValidator


def entry(index: int, weights: str = "1Gi", **spec_extra: Any) -> dict[str, Any]:
    spec = {"model": {"source": {"uri": f"/models/m{index}"}, "weightsBytes": weights},
            **spec_extra}  # fmt: skip
    return {
        "uid": str(uuid.UUID(int=index + 1)),
        "namespace": "default",
        "name": f"m{index}",
        "generation": 1,
        "spec": spec,
        "policy": effective_policy({}, BUILTIN_DEFAULTS).to_status().to_dict(),
    }


def body(entries: list[dict[str, Any]]) -> dict[str, Any]:
    return {"revision": {"term": 1, "counter": 1}, "entries": entries}


@pytest.fixture
def validations(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    control._spec_problems.cache_clear()
    control._policy_problems.cache_clear()
    calls: list[int] = []
    real = SchemaValidator.validate

    def counting(self: SchemaValidator, obj: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(self, obj, *args, **kwargs)

    monkeypatch.setattr(SchemaValidator, "validate", counting)
    return calls


def test_an_unchanged_set_is_checked_once(validations: list[int]) -> None:
    entries = [entry(i) for i in range(300)]
    control.parse_desired_set(body(entries))
    first = len(validations)
    assert first >= 300  # every spec checked once
    control.parse_desired_set(body(entries))
    assert len(validations) == first  # nothing checked again


def test_a_refused_spec_stays_refused_and_names_its_entry(validations: list[int]) -> None:
    bad = entry(1, weights="0")
    for index in (0, 3):  # same spec at another index: the path follows the index
        entries = [entry(9), entry(8), entry(7)]
        entries.insert(index, bad)
        with pytest.raises(ResourceError) as refused:
            control.parse_desired_set(body(entries))
        assert refused.value.errors[0].path.startswith(f"entries[{index}].spec.model.weightsBytes")


def test_a_large_spec_is_checked_every_time(validations: list[int]) -> None:
    # Over 16 KiB of canonical JSON (its values are too long for label values, so it is
    # refused too): checked in full each time, never held by the cache.
    big = entry(1, placement={"nodeSelector": {f"k{i}": "v" * 300 for i in range(60)}})
    counts = [len(validations)]  # building the entry's policy validated too
    for _ in range(2):
        with pytest.raises(ResourceError):
            control.parse_desired_set(body([big]))
        counts.append(len(validations))
    assert counts[1] - counts[0] == counts[2] - counts[1] > 0
    assert control._spec_problems.cache_info().currsize == 0
