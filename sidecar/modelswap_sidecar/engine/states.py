"""Engine states of a model (DESIGN.md §4), their legal transitions, and the table that
maps each to the ModelDeployment phase and conditions the operator reports.

    LOADING → RESIDENT → DRAINING → QUIESCED → SAVING → UNMAPPED → SWAPPED_OUT
    SWAPPED_OUT → ALLOCATING → MAPPED → RESTORING → RESIDENT
    plus DROPPED (onSwapOut: drop: UNMAPPED → DROPPED, host copy discarded; a later
    swap-in reloads: DROPPED → LOADING), FAILED (an unrecoverable error, with a reason;
    FAILED → LOADING reloads from the source) and DELETING (remove_model; the record goes
    away when it finishes). Any step of a swap rolls back to where it started.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class EngineState(enum.StrEnum):
    LOADING = "Loading"  # no complete copy yet: the runtime is loading from the source
    RESIDENT = "Resident"
    DRAINING = "Draining"  # swap-out: waiting for in-flight work (every instance)
    QUIESCED = "Quiesced"
    SAVING = "Saving"  # copying preserved KV to the host store
    UNMAPPED = "Unmapped"  # clients unmapped; releasing chunks
    SWAPPED_OUT = "SwappedOut"
    ALLOCATING = "Allocating"  # swap-in: making room, creating chunks
    MAPPED = "Mapped"  # clients mapped fresh chunks at the old addresses
    RESTORING = "Restoring"  # copying host copies into them
    DROPPED = "Dropped"  # unloaded (onSwapOut: drop); nothing held
    FAILED = "Failed"
    DELETING = "Deleting"


S = EngineState

#: Legal transitions; everything else is a bug (asserted by the engine).
TRANSITIONS: dict[EngineState, frozenset[EngineState]] = {
    # DRAINING: a swap-out of a dropped model swapped in whose reload has not committed
    S.LOADING: frozenset(
        {S.RESIDENT, S.LOADING, S.SWAPPED_OUT, S.FAILED, S.DELETING, S.DROPPED, S.DRAINING}
    ),
    S.RESIDENT: frozenset({S.DRAINING, S.SWAPPED_OUT, S.LOADING, S.DELETING, S.FAILED}),
    S.DRAINING: frozenset({S.QUIESCED, S.RESIDENT, S.SWAPPED_OUT, S.LOADING}),
    S.QUIESCED: frozenset({S.SAVING, S.UNMAPPED, S.RESIDENT, S.SWAPPED_OUT, S.LOADING}),
    S.SAVING: frozenset({S.UNMAPPED, S.RESIDENT, S.SWAPPED_OUT, S.LOADING}),
    S.UNMAPPED: frozenset({S.SWAPPED_OUT, S.DROPPED}),
    S.SWAPPED_OUT: frozenset({S.ALLOCATING, S.DELETING, S.DROPPED, S.SWAPPED_OUT, S.FAILED}),
    S.ALLOCATING: frozenset({S.MAPPED, S.SWAPPED_OUT, S.FAILED}),
    S.MAPPED: frozenset({S.RESTORING, S.SWAPPED_OUT, S.FAILED}),
    S.RESTORING: frozenset({S.RESIDENT, S.SWAPPED_OUT, S.FAILED}),
    S.DROPPED: frozenset({S.LOADING, S.DELETING}),
    S.FAILED: frozenset({S.LOADING, S.DELETING}),
    S.DELETING: frozenset(),
}


@dataclass(frozen=True, slots=True)
class Condition:
    type: str
    status: bool
    reason: str


@dataclass(frozen=True, slots=True)
class PhaseRow:
    phase: str  # ModelDeployment status.phase
    loaded: Condition
    ready: Condition


def _row(phase: str, loaded: bool, ready: bool, reason: str) -> PhaseRow:
    return PhaseRow(phase, Condition("Loaded", loaded, reason), Condition("Ready", ready, reason))


#: Every engine state → CRD phase and the Loaded/Ready conditions (Placed and PolicyValid
#: are the operator's). A swapped-out model is Ready: a request swaps it in.
PHASES: dict[EngineState, PhaseRow] = {
    S.LOADING: _row("Loading", False, False, "Loading"),
    S.RESIDENT: _row("Resident", True, True, "Resident"),
    S.DRAINING: _row("SwappingOut", True, False, "Draining"),
    S.QUIESCED: _row("SwappingOut", True, False, "Quiesced"),
    S.SAVING: _row("SwappingOut", True, False, "SavingKV"),
    S.UNMAPPED: _row("SwappingOut", True, False, "Unmapped"),
    S.SWAPPED_OUT: _row("SwappedOut", True, True, "SwappedOut"),
    S.ALLOCATING: _row("SwappingIn", True, False, "Allocating"),
    S.MAPPED: _row("SwappingIn", True, False, "Mapped"),
    S.RESTORING: _row("SwappingIn", True, False, "Restoring"),
    S.DROPPED: _row("Dropped", False, False, "Dropped"),
    S.FAILED: _row("Failed", False, False, "Failed"),
    S.DELETING: _row("Deleting", False, False, "Deleting"),
}


def phase_of(state: EngineState) -> PhaseRow:
    return PHASES[state]


def check_transition(old: EngineState, new: EngineState) -> None:
    if new not in TRANSITIONS[old]:
        raise AssertionError(f"illegal engine transition {old} → {new}")
