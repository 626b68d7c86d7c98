"""One model's state in every vocabulary: engine state → residency and phase, and the
agent's serving state over them (`modelswap_sidecar.model_states`)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from modelswap_sidecar import model_states
from modelswap_sidecar.engine.states import EngineState
from modelswap_sidecar.model_states import (
    Serving,
    answers_now,
    charged_residency,
    phase_of,
    reported_state,
    residency_of,
)
from modelswap_sidecar.policy.inputs import CHARGED, Residency

S = EngineState

#: States in which the model's chunks are (or may be) mapped by its clients.
HOLDS_MEMORY = frozenset(
    {S.LOADING, S.RESIDENT, S.DRAINING, S.QUIESCED, S.SAVING, S.ALLOCATING, S.MAPPED, S.RESTORING}
)


def test_every_engine_state_has_a_residency_and_memory_holders_are_charged() -> None:
    for state in EngineState:
        residency = residency_of(state)
        if state in HOLDS_MEMORY:
            assert residency in CHARGED, state
    assert residency_of(EngineState.SWAPPED_OUT) is Residency.SWAPPED_OUT
    assert residency_of(EngineState.RESIDENT) is Residency.RESIDENT


def test_every_engine_state_has_a_phase() -> None:
    assert phase_of(S.RESIDENT) == "Resident"
    assert phase_of(S.DRAINING) == "SwappingOut"
    assert phase_of(S.RESTORING) == "SwappingIn"
    assert {phase_of(s) for s in EngineState} >= {"Loading", "SwappedOut", "Failed"}


@pytest.mark.parametrize(
    ("serving", "attaches", "engine", "expected"),
    [
        (Serving.LOADING, True, None, Residency.LOADING),
        (Serving.DROPPED, False, None, Residency.SWAPPED_OUT),
        (Serving.PENDING, True, S.RESIDENT, None),
        (Serving.FAILED, True, None, None),
        (Serving.UNLOADED, True, S.SWAPPED_OUT, None),
        (Serving.LOADED, False, None, Residency.RESIDENT),
        (Serving.LOADED, True, None, Residency.LOADING),
        (Serving.LOADED, True, S.SAVING, Residency.SWAPPING_OUT),
        (Serving.LOADED, True, S.SWAPPED_OUT, Residency.SWAPPED_OUT),
    ],
)
def test_the_serving_state_decides_what_is_charged_before_the_engine_state(
    serving: Serving, attaches: bool, engine: EngineState | None, expected: Residency | None
) -> None:
    assert charged_residency(serving, attaches=attaches, engine_state=engine) is expected


@pytest.mark.parametrize(
    ("serving", "attaches", "engine", "expected"),
    [
        (Serving.PENDING, True, None, ("Loading", "Pending")),
        (Serving.DEFERRED, True, None, ("Loading", "Pending")),
        (Serving.LOADING, True, S.RESIDENT, ("Loading", "Loading")),
        (Serving.DROPPED, False, None, ("Dropped", "Dropped")),
        (Serving.UNLOADING, True, S.RESIDENT, ("Draining", "SwappingOut")),
        (Serving.FAILED, True, S.RESIDENT, ("Failed", "Failed")),
        (Serving.LOADED, False, None, ("resident", "Resident")),
        (Serving.UNLOADED, True, None, ("swapped_out", "SwappedOut")),
        (Serving.LOADED, True, None, ("loading", "Loading")),
        (Serving.LOADED, True, S.SWAPPED_OUT, ("SwappedOut", "SwappedOut")),
        (Serving.LOADED, True, S.ALLOCATING, ("Allocating", "SwappingIn")),
    ],
)
def test_the_reported_state_and_phase(
    serving: Serving, attaches: bool, engine: EngineState | None, expected: tuple[str, str]
) -> None:
    assert reported_state(serving, attaches=attaches, engine_state=engine) == expected


@pytest.mark.parametrize(
    ("serving", "attaches", "engine", "expected"),
    [
        (Serving.LOADED, True, S.RESIDENT, True),
        (Serving.LOADED, True, S.LOADING, True),  # a dropped model's swap-in mapped memory
        (Serving.LOADED, True, S.SWAPPED_OUT, False),
        (Serving.LOADED, True, S.RESTORING, False),
        (Serving.LOADED, True, None, False),
        (Serving.LOADED, False, None, True),
        (Serving.DROPPED, False, None, False),
        (Serving.LOADING, True, S.RESIDENT, False),
    ],
)
def test_what_answers_a_request_without_a_swap_in(
    serving: Serving, attaches: bool, engine: EngineState | None, expected: bool
) -> None:
    assert answers_now(serving, attaches=attaches, engine_state=engine) is expected


def test_nothing_outside_the_engine_reads_its_phase_table() -> None:
    """Every caller outside the engine maps states through `model_states` (one mapping)."""
    root = Path(model_states.__file__).parent
    callers = [
        str(path.relative_to(root))
        for path in root.rglob("*.py")
        if "engine" not in path.relative_to(root).parts[:1]
        and path.name != "model_states.py"
        and re.search(
            r"engine\.states import[^\n]*\bphase_of\b|engine_states\.phase_of", path.read_text()
        )
    ]
    assert callers == []
