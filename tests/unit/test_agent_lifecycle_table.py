"""An agent model's lifecycle has one owner (issue 28, item 2): `agent/core/lifecycle.py`
holds the transition table of `serving`, is the only code in the sidecar that assigns it,
and is the one place a record is made; a move the table does not hold is refused."""

from __future__ import annotations

import ast
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

import modelswap_sidecar
from modelswap_api.control import DesiredEntry
from modelswap_api.defaults import BUILTIN_DEFAULTS
from modelswap_api.models import ModelDeploymentSpec
from modelswap_api.policy import effective_policy
from modelswap_sidecar.agent.core import lifecycle
from modelswap_sidecar.agent.core.records import AgentModel
from modelswap_sidecar.model_states import Serving

SPEC = {"model": {"source": {"uri": "/models/toy"}, "weightsBytes": "32Mi"}}
PACKAGE = Path(modelswap_sidecar.__file__).parent
LIFECYCLE = PACKAGE / "agent" / "core" / "lifecycle.py"


def entry_of(name: str) -> DesiredEntry:
    return DesiredEntry(
        uid=str(uuid.uuid5(uuid.NAMESPACE_DNS, name)),
        namespace="ns",
        name=name,
        generation=3,
        spec=ModelDeploymentSpec.from_dict(SPEC),
        policy=effective_policy(SPEC, BUILTIN_DEFAULTS).to_status(),
    )


def held(name: str = "toy") -> tuple[dict[str, AgentModel], AgentModel]:
    records: dict[str, AgentModel] = {}
    model = lifecycle.hold(records, entry_of(name), effective_policy(SPEC, BUILTIN_DEFAULTS))
    return records, model


def _modules() -> list[tuple[Path, ast.Module]]:
    return [(p, ast.parse(p.read_text(), str(p))) for p in sorted(PACKAGE.rglob("*.py"))]


def test_every_serving_state_has_a_row_and_every_state_can_be_loaded_again() -> None:
    assert set(lifecycle.TRANSITIONS) == set(Serving)
    for state, targets in lifecycle.TRANSITIONS.items():
        assert Serving.PENDING in targets, state  # any model may be placed anew


def test_only_the_lifecycle_module_assigns_serving() -> None:
    writers = set()
    for path, tree in _modules():
        for node in ast.walk(tree):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets = [node.target]
            for target in targets:
                for t in ast.walk(target):
                    if isinstance(t, ast.Attribute) and t.attr == "serving":
                        writers.add(path)
    assert writers == {LIFECYCLE}


def test_records_are_made_in_one_place() -> None:
    makers = {
        path
        for path, tree in _modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "AgentModel"
    }
    assert makers == {LIFECYCLE}


def test_hold_enters_a_pending_record_under_its_instance_key() -> None:
    records, model = held()
    assert records == {model.uid: model}
    assert model.serving is Serving.PENDING


def test_a_load_moves_through_loading_to_loaded_with_its_reason_and_clock() -> None:
    _, model = held()
    lifecycle.place(model, 1, "fits on GPU 1")
    assert (model.serving, model.gpu, model.reason, model.message) == (
        Serving.LOADING,
        1,
        "Loading",
        "fits on GPU 1",
    )
    lifecycle.loaded(model, 42.0)
    assert (model.serving, model.reason, model.resident_since_seconds) == (
        Serving.LOADED,
        "Loaded",
        42.0,
    )


def test_a_failed_load_records_when_and_for_which_generation() -> None:
    _, model = held()
    lifecycle.place(model, 0, "")
    lifecycle.fail(model, "LoadFailed", "no such file", 7.0)
    assert model.serving is Serving.FAILED
    assert (model.failed_at_seconds, model.failed_generation) == (7.0, 3)
    assert (model.reason, model.message) == ("LoadFailed", "no such file")


def test_unloaded_keeps_no_residency_and_says_why() -> None:
    _, model = held()
    lifecycle.place(model, 0, "")
    lifecycle.loaded(model, 1.0)
    lifecycle.unloading(model)
    lifecycle.unloaded(model)
    assert model.serving is Serving.UNLOADED
    assert model.resident_since_seconds is None
    assert model.reason == "Unloaded"


@pytest.mark.parametrize(
    ("path", "illegal"),
    [
        ((), lambda m: lifecycle.loaded(m, 0.0)),  # PENDING → LOADED: never loaded
        ((), lifecycle.dropped),  # PENDING → DROPPED: nothing to drop
        ((), lifecycle.unloading),  # PENDING → UNLOADING: nothing in Triton
        (("place", "loaded"), lambda m: lifecycle.defer(m, "x", "")),  # LOADED → DEFERRED
        (("place", "loaded", "unloading", "unloaded"), lifecycle.reloading_dropped),
    ],
)
def test_a_move_the_table_does_not_hold_is_refused(
    path: tuple[str, ...], illegal: Callable[[AgentModel], None]
) -> None:
    _, model = held()
    steps: dict[str, Callable[[AgentModel], None]] = {
        "place": lambda m: lifecycle.place(m, 0, ""),
        "loaded": lambda m: lifecycle.loaded(m, 0.0),
        "unloading": lifecycle.unloading,
        "unloaded": lifecycle.unloaded,
    }
    for step in path:
        steps[step](model)
    before = model.serving
    with pytest.raises(AssertionError, match="illegal serving transition"):
        illegal(model)
    assert model.serving is before
