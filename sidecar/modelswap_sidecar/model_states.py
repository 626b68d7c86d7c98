"""One model's state in each vocabulary the node speaks, and the one mapping between them.

- `EngineState` (`engine.states`): where the engine has the model's memory.
- `Serving`: the agent's own view: is the model loaded in the runtime, or why not.
- `Residency` (`policy.inputs`): where the model's bytes are charged, as the policy weighs
  each GPU's HBM.
- the phase (`modelswap_api.models.Phase`): what the control API and the ModelDeployment
  status report, with the state's name beside it.

`residency_of` and `phase_of` read an engine state alone; `charged_residency`,
`reported_state` and `answers_now` put the agent's serving state over the engine's (a model
the runtime does not serve has no engine state worth reading). Every caller outside the
engine maps through here.
"""

from __future__ import annotations

import enum
from typing import cast

from modelswap_api.models import Phase
from modelswap_sidecar.engine import states as engine_states
from modelswap_sidecar.engine.states import EngineState
from modelswap_sidecar.policy.inputs import Residency

S = EngineState


class Serving(enum.StrEnum):
    """The agent's view of one model (`agent.core.records.AgentModel.serving`)."""

    PENDING = "pending"  # taken, not placed yet
    DEFERRED = "deferred"  # cannot be placed now (no room, fenced); retried
    LOADING = "loading"  # placed; source resolving or Triton loading
    LOADED = "loaded"  # Triton serves it
    DROPPED = "dropped"  # unloaded by a `drop` swap-out; loaded again on swap-in
    UNLOADING = "unloading"
    UNLOADED = "unloaded"  # missing from the set past its grace; host bytes kept
    FAILED = "failed"  # the load failed (bad source, refused); retried later


#: Every engine state as the policy charges it. A state a swap passes through stays
#: charged to the GPU until the swap ends: a model part-way out still holds its chunks
#: (UNMAPPED is releasing them), one part-way in already holds the new ones. DELETING is
#: charged until the engine forgets the model.
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

#: Engine states in which a loaded model answers a request without a swap-in: RESIDENT, and
#: LOADING after a swap-in of a dropped model (fresh memory mapped; the model reloads its
#: weights from its source inside the request that follows, and commits).
_ANSWERS = frozenset({S.RESIDENT, S.LOADING})

#: Serving states that say more than the engine's state does: (state, phase) reported.
_OWN: dict[Serving, tuple[str, Phase]] = {
    Serving.PENDING: (str(S.LOADING), "Pending"),
    Serving.DEFERRED: (str(S.LOADING), "Pending"),
    Serving.LOADING: (str(S.LOADING), "Loading"),
    Serving.DROPPED: (str(S.DROPPED), "Dropped"),
    Serving.UNLOADING: (str(S.DRAINING), "SwappingOut"),
    Serving.FAILED: (str(S.FAILED), "Failed"),
}


def residency_of(state: EngineState) -> Residency:
    return RESIDENCY[state]


def phase_of(state: EngineState) -> Phase:
    """The phase the engine reports for `state` (its own table, `engine.states.PHASES`)."""
    return cast(Phase, engine_states.phase_of(state).phase)


def charged_residency(
    serving: Serving,
    *,
    attaches: bool,
    engine_state: EngineState | None,
    requests_in_flight: int = 0,
) -> Residency | None:
    """Where a model's bytes are for the budget; None: it claims no HBM and is not wanted
    in. Only a model the runtime serves (or is loading, or dropped and due back) holds or
    may claim HBM; a runtime that cannot attach holds all of it while loaded.
    `requests_in_flight`: the model's requests admitted and not yet answered."""
    if serving is Serving.LOADING:
        return Residency.LOADING
    if serving is Serving.DROPPED:
        return Residency.SWAPPED_OUT
    if serving is not Serving.LOADED:
        return None
    if not attaches:
        return Residency.RESIDENT
    if engine_state is None:
        return Residency.LOADING
    if engine_state is EngineState.LOADING:
        # a dropped model swapped in: fresh memory mapped, its weights loaded by its next
        # request. Idle, it answers and dropping it again loses nothing, so it is weighed
        # as resident (it goes; a swap-in may take it as a victim) rather than as a load
        # under way that others wait for. With requests in flight, the first of them is
        # loading its weights inside in_use() and commits them there: a load under way,
        # never a victim (a swap-out would drain the very request that commits).
        return Residency.LOADING if requests_in_flight else Residency.RESIDENT
    return residency_of(engine_state)


def reported_state(
    serving: Serving, *, attaches: bool, engine_state: EngineState | None
) -> tuple[str, Phase]:
    """(state, phase) the control API reports for a model (`engine_state`: None when the
    engine holds no record of it, or it does not attach)."""
    if serving in _OWN:
        return _OWN[serving]
    if serving is Serving.LOADED and not attaches:
        return "resident", "Resident"
    if engine_state is None:
        if serving is Serving.UNLOADED:
            return "swapped_out", "SwappedOut"
        return "loading", "Loading"
    return str(engine_state), phase_of(engine_state)


def answers_now(serving: Serving, *, attaches: bool, engine_state: EngineState | None) -> bool:
    """A request to the model is answered without a swap-in: the runtime serves it and,
    for a model that maps memory through the client library, the engine holds it."""
    if serving is not Serving.LOADED:
        return False
    return not attaches or engine_state in _ANSWERS
