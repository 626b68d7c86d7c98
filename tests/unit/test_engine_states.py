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


def test_drop_failure_and_removal_paths_are_legal() -> None:
    s = EngineState
    drop = [s.RESIDENT, s.DRAINING, s.QUIESCED, s.UNMAPPED, s.DROPPED, s.LOADING, s.RESIDENT]
    for a, b in itertools.pairwise(drop):
        assert b in TRANSITIONS[a], (a, b)
    for mid_swap_in in (s.ALLOCATING, s.MAPPED, s.RESTORING):
        assert s.FAILED in TRANSITIONS[mid_swap_in]
    assert s.LOADING in TRANSITIONS[s.FAILED]  # reload from the source
    for settled in (s.LOADING, s.RESIDENT, s.SWAPPED_OUT, s.DROPPED, s.FAILED):
        assert s.DELETING in TRANSITIONS[settled]
    assert TRANSITIONS[s.DELETING] == frozenset()
