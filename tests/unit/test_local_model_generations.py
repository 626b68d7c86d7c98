"""Local mode sends a model generation with each entry, as the operator does: the generation
at which the fields of spec.model that change the model's bytes last changed. Without it
an edited weightsBytes or source is refused by the agent (`ModelChanged`)."""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from modelswap_api.control import parse_desired_set
from modelswap_api.defaults import BUILTIN_DEFAULTS
from modelswap_sidecar.local.desired import Generations, desired_set
from modelswap_sidecar.local.manifests import LocalModel, read_folder

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "examples" / "toy"


def classify() -> LocalModel:
    models, _ = read_folder(TOY, BUILTIN_DEFAULTS)
    return next(m for m in models if m.name == "classify")


def edited(model: LocalModel, **fields: Any) -> LocalModel:
    spec = copy.deepcopy(model.spec)
    for path, value in fields.items():
        *parents, last = path.split("__")
        at = spec
        for part in parents:
            at = at.setdefault(part, {})
        at[last] = value
    return replace(model, spec=spec)


def push(generations: Generations, model: LocalModel, counter: int) -> tuple[int, int | None]:
    sent = desired_set([model], generations, counter=counter, node_name="local")
    entry = parse_desired_set(sent.to_dict()).entries[0]  # as the agent reads it
    return entry.generation, entry.model_generation


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("model__weightsBytes", "48Mi"),
        ("model__kvCacheBytes", "1Mi"),
        ("model__source", {"uri": "/models/classify-v2"}),
        ("model__source__sha256", "0" * 64),
    ],
)
def test_a_changed_model_field_advances_the_model_generation(field: str, value: Any) -> None:
    generations = Generations()
    model = classify()
    assert push(generations, model, 1) == (1, 1)
    assert push(generations, model, 2) == (1, 1)  # unchanged: nothing advances
    changed = edited(model, **{field: value})
    assert push(generations, changed, 3) == (2, 2)
    assert push(generations, changed, 4) == (2, 2)  # the same again: kept


def test_a_policy_or_name_edit_keeps_the_model_generation() -> None:
    generations = Generations()
    model = classify()
    push(generations, model, 1)
    model = edited(model, model__weightsBytes="48Mi")
    assert push(generations, model, 2) == (2, 2)
    model = edited(model, swapPolicy__idleAfter="45s")
    assert push(generations, model, 3) == (3, 2)
    model = edited(model, model__name="classify-renamed")
    assert push(generations, model, 4) == (4, 2)
    model = edited(model, model__weightsBytes="32Mi")  # back to the first size: a new model
    assert push(generations, model, 5) == (5, 5)


def test_a_dev_model_sends_no_model_generation() -> None:
    generations = Generations()
    model = replace(classify(), dev=True)
    assert push(generations, model, 1) == (1, None)
    assert push(generations, edited(model, model__weightsBytes="48Mi"), 2) == (2, None)
