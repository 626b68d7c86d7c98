from __future__ import annotations

import itertools

from modelswap_sidecar.engine.states import PHASES, TRANSITIONS, EngineState

CRD_PHASES = {
    "Pending",
    "Placed",
    "Loading",
    "Resident",
    "SwappingOut",
    "SwappedOut",
    "SwappingIn",
    "Dropped",
    "Failed",
    "Deleting",
}


def test_every_engine_state_maps_to_a_crd_phase_and_conditions() -> None:
    for state in EngineState:
        row = PHASES[state]
        assert row.phase in CRD_PHASES
        assert row.loaded.type == "Loaded" and row.ready.type == "Ready"
        assert state in TRANSITIONS


def test_swap_cycle_is_a_legal_path() -> None:
    path = [
        "Loading",
        "Resident",
        "Draining",
        "Quiesced",
        "Saving",
        "Unmapped",
        "SwappedOut",
        "Allocating",
        "Mapped",
        "Restoring",
        "Resident",
    ]
    for a, b in itertools.pairwise(path):
        assert EngineState(b) in TRANSITIONS[EngineState(a)], (a, b)
    assert EngineState.SWAPPED_OUT in TRANSITIONS[EngineState.RESTORING]  # rollback
    assert EngineState.RESIDENT in TRANSITIONS[EngineState.SAVING]  # rollback
