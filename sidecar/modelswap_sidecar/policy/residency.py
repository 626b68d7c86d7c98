"""Engine states (DESIGN.md §4) as the policy sees them: where the bytes are charged.

Every state a swap passes through stays charged to the GPU until the swap ends: a model
part-way out still holds its chunks (UNMAPPED is releasing them), one part-way in already
holds the new ones. DELETING is charged until the engine forgets it.
"""

from __future__ import annotations

from modelswap_sidecar.engine.states import EngineState
from modelswap_sidecar.policy.inputs import Residency

S = EngineState

RESIDENCY: dict[EngineState, Residency] = {
    S.LOADING: Residency.LOADING,
    S.RESIDENT: Residency.RESIDENT,
    S.DRAINING: Residency.SWAPPING_OUT,
    S.QUIESCED: Residency.SWAPPING_OUT,
    S.SAVING: Residency.SWAPPING_OUT,
    S.UNMAPPED: Residency.SWAPPING_OUT,
    S.SWAPPED_OUT: Residency.SWAPPED_OUT,
    S.ALLOCATING: Residency.SWAPPING_IN,
    S.MAPPED: Residency.SWAPPING_IN,
    S.RESTORING: Residency.SWAPPING_IN,
    S.DROPPED: Residency.SWAPPED_OUT,
    S.FAILED: Residency.SWAPPED_OUT,
    S.DELETING: Residency.SWAPPING_OUT,
}


def residency_of(state: EngineState) -> Residency:
    return RESIDENCY[state]
