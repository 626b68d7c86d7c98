"""An `AgentModel`'s lifecycle: its `serving` states (`model_states.Serving`), their legal
transitions, and the moves between them. This module is the only code that assigns
`serving` (the phase the operator reports is derived from it and the engine's state,
`model_states`), and `hold` is the one place a record is made and entered in the table.

    PENDING → LOADING → LOADED                     placed, loaded (or adopted)
    PENDING | DEFERRED | FAILED → DEFERRED         no room now, fenced: placed again later
    LOADING → FAILED → LOADING                     a failed load, retried
    LOADED → DROPPED → LOADING → LOADED            a drop-style swap-out, its swap-in
    any → UNLOADING → UNLOADED                     missing from the set, forgotten
    any → PENDING                                  loaded again (a reload, Triton restarted,
                                                   its process gone, taken back into the set)

Each move sets the reason and message that go with it. A move the table does not hold is a
bug (AssertionError), as in the engine's `states.check_transition`.
"""

from __future__ import annotations

from collections.abc import MutableMapping

from modelswap_api.control import DesiredEntry
from modelswap_api.policy import EffectivePolicy
from modelswap_sidecar.agent.core.records import AgentModel
from modelswap_sidecar.model_states import Serving

S = Serving

#: Legal moves of `serving`. PENDING is reachable from every state: a model is loaded again
#: (placed anew) after a reload, a Triton restart, its process gone, or when the set takes
#: it back while it is being unloaded.
TRANSITIONS: dict[Serving, frozenset[Serving]] = {
    S.PENDING: frozenset({S.PENDING, S.DEFERRED, S.LOADING, S.UNLOADED}),
    S.DEFERRED: frozenset({S.PENDING, S.DEFERRED, S.LOADING, S.UNLOADED}),
    # DEFERRED: a victim its placement counted on did not give up its room
    S.LOADING: frozenset({S.PENDING, S.LOADED, S.FAILED, S.DEFERRED, S.UNLOADING}),
    S.LOADED: frozenset({S.PENDING, S.DROPPED, S.UNLOADING}),
    S.DROPPED: frozenset({S.PENDING, S.LOADING, S.UNLOADING}),
    S.FAILED: frozenset({S.PENDING, S.DEFERRED, S.LOADING, S.UNLOADED}),
    S.UNLOADING: frozenset({S.PENDING, S.UNLOADED}),
    S.UNLOADED: frozenset({S.PENDING, S.UNLOADED}),
}

#: The reason of a model taken back from a previous agent while its clients readopt.
ADOPTING = "Adopting"
ADOPTED = "Adopted"
UNLOADED_REASON = "Unloaded"


def check_transition(old: Serving, new: Serving) -> None:
    if new not in TRANSITIONS[old]:
        raise AssertionError(f"illegal serving transition {old} → {new}")


def is_loaded(model: AgentModel) -> bool:
    """The runtime serves it (read after a move, where a type checker still holds the
    state it saw before)."""
    return model.serving is S.LOADED


def _move(model: AgentModel, to: Serving) -> None:
    check_transition(model.serving, to)
    model.serving = to


# -- records -------------------------------------------------------------------------------


def hold(
    records: MutableMapping[str, AgentModel], entry: DesiredEntry, policy: EffectivePolicy
) -> AgentModel:
    """A new record of `entry` (PENDING), entered in `records` under its instance key
    (replacing any there). ValueError for a UID that is not a UUID."""
    model = AgentModel(entry=entry, policy=policy)
    records[model.uid] = model
    return model


# -- placing and loading ---------------------------------------------------------------------


def defer(model: AgentModel, reason: str, message: str) -> None:
    """It cannot be placed now (no room, fenced): placed again on a later pass."""
    _move(model, S.DEFERRED)
    model.reason, model.message = reason, message


def place(model: AgentModel, gpu: int, message: str) -> None:
    """Placed on GPU ordinal `gpu`: its load starts."""
    model.gpu = gpu
    _move(model, S.LOADING)
    model.reason, model.message = "Loading", message


def loaded(model: AgentModel, now_seconds: float) -> None:
    """Its load finished: the runtime serves it, resident from `now_seconds`."""
    _move(model, S.LOADED)
    model.reason, model.message = model.loaded_reason()
    model.resident_since_seconds = now_seconds


def fail(model: AgentModel, reason: str, message: str, now_seconds: float) -> None:
    """Its load failed: retried after `retryFailedSeconds`, or at its next generation."""
    _move(model, S.FAILED)
    model.reason, model.message = reason, message
    model.failed_at_seconds = now_seconds
    model.failed_generation = model.entry.generation


def pending(model: AgentModel) -> None:
    """Waiting to be placed (again), its reason left as it was."""
    _move(model, S.PENDING)


def load_again(model: AgentModel, reason: str, message: str) -> None:
    """Pending again (not charged to any GPU): the policy loop places and loads it from the
    host store (a reload, Triton restarted, its process gone)."""
    _move(model, S.PENDING)
    model.reason, model.message = reason, f"{message}; loading it again from the host store"
    model.resident_since_seconds = None


# -- adoption --------------------------------------------------------------------------------


def adopting(model: AgentModel) -> None:
    """Taken back from a previous agent: held as loading until its clients readopt."""
    _move(model, S.LOADING)
    model.reason, model.message = ADOPTING, "waiting for its clients to readopt"


def adopted(model: AgentModel, now_seconds: float) -> None:
    """Its clients readopted: loaded, resident from `now_seconds`."""
    _move(model, S.LOADED)
    model.resident_since_seconds = now_seconds
    model.reason, model.message = ADOPTED, ""


# -- drop-style swaps ------------------------------------------------------------------------


def dropped(model: AgentModel) -> None:
    """A drop-style swap-out unloaded it from the runtime: its next swap-in loads it."""
    _move(model, S.DROPPED)


def reloading_dropped(model: AgentModel) -> None:
    """A swap-in of a dropped model: loaded again from its source."""
    _move(model, S.LOADING)


# -- unloading -------------------------------------------------------------------------------


def unloading(model: AgentModel) -> None:
    _move(model, S.UNLOADING)


def unloaded(model: AgentModel) -> None:
    """Out of the runtime, missing from the set: host-store bytes kept."""
    _move(model, S.UNLOADED)
    model.reason = UNLOADED_REASON
    model.message = "missing from the desired set; host-store bytes kept"
    model.resident_since_seconds = None
