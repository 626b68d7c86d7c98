"""Room for a swap-in: admit (after swapping out victims), wait, or refuse.

    admit(node, uid, now_seconds, settings, waited_seconds=None) -> Admission

In order, the first that works:
1. it fits in the GPU's budget as things are → admit;
2. ordinary victims (resident, unpinned, past `minResident`, no request in flight) free
   enough → admit after swapping them out;
3. ordinary victims plus swap-outs already under way would free enough → wait;
4. idle victims younger than `minResident` make it fit → admit (no drain needed);
5. busy victims (requests in flight) would make it fit, and the caller has been asking for
   less than `busy_victim_wait_seconds` → wait for one to become idle: its requests
   usually end sooner than a drain of one chosen victim, and none of a victim's queued
   requests is held back until it returns;
6. victims with requests in flight, fewest requests first, make it fit → admit (they
   drain first);
7. bytes under way (swap-outs, and unpinned models still loading or swapping in, which
   become victims once resident) would be enough → wait;
8. otherwise → refuse, with the numbers.
Steps 4 and 6 are the only cases the anti-thrash rule gives way: the request would
otherwise wait on or be refused. `waited_seconds` is how long the caller has been asking
for this model; None means it will not ask again for a busy model to finish (step 5 is
skipped). A model bigger than the GPU's whole budget is refused at once. Pinned models are
never victims.
"""

from __future__ import annotations

from collections.abc import Iterable

from modelswap_sidecar.policy.decisions import Admission, AdmissionOutcome, SwapOutReason
from modelswap_sidecar.policy.inputs import ModelView, NodeView, PolicySettings, Residency
from modelswap_sidecar.policy.victims import choose, evictable, swap_out_of

_ARRIVING = frozenset({Residency.LOADING, Residency.SWAPPING_IN})


def admit(
    node: NodeView,
    uid: str,
    now_seconds: float,
    settings: PolicySettings,
    *,
    waited_seconds: float | None = None,
) -> Admission:
    model = node.model(uid)
    if model.residency is Residency.RESIDENT:
        return _answer(model, AdmissionOutcome.ADMIT, "AlreadyResident", "already resident")
    if model.residency in _ARRIVING:
        return _answer(model, AdmissionOutcome.WAIT, "InProgress", f"already {model.residency}")
    if model.residency is Residency.SWAPPING_OUT:
        return _answer(
            model, AdmissionOutcome.WAIT, "SwappingOut", "a swap-out is under way; ask again"
        )
    may_wait = waited_seconds is not None and waited_seconds < settings.busy_victim_wait_seconds
    return _make_room(node, model, now_seconds, settings, may_wait_for_idle=may_wait)


def _make_room(
    node: NodeView,
    model: ModelView,
    now_seconds: float,
    settings: PolicySettings,
    *,
    may_wait_for_idle: bool,
) -> Admission:
    gpu = node.gpu(model.gpu)
    need = model.hbm_bytes
    if need > gpu.budget_bytes:
        return _answer(
            model,
            AdmissionOutcome.REFUSE,
            "LargerThanBudget",
            f"needs {need} bytes; GPU {gpu.gpu}'s whole budget is {gpu.budget_bytes}",
        )
    deficit = node.used_bytes(gpu.gpu) + need - gpu.budget_bytes
    if deficit <= 0:
        return _answer(model, AdmissionOutcome.ADMIT, "Fits", f"{need} bytes fit on {gpu.gpu}")
    others = [m for m in node.models_on(gpu.gpu) if m.uid != model.uid]
    leaving = node.leaving_bytes(gpu.gpu)

    ordinary = [m for m in others if evictable(m, now_seconds, allow_young=False)]
    victims = choose(ordinary, deficit, gpu, now_seconds, settings)
    if victims is not None:
        message = f"swapping out {len(victims)} model(s) to free {deficit} bytes on {gpu.gpu}"
        return _with_victims(model, "VictimsChosen", message, victims)
    if _total(ordinary) + leaving >= deficit:
        message = f"{leaving} bytes are being swapped out on {gpu.gpu}; ask again when done"
        return _answer(model, AdmissionOutcome.WAIT, "WaitingForSwapOuts", message)

    any_resident = [m for m in others if evictable(m, now_seconds, allow_young=True)]
    idle = [m for m in any_resident if m.active_requests == 0]
    victims = choose(idle, deficit, gpu, now_seconds, settings)
    if victims is not None:
        message = (
            f"swapping out {len(victims)} idle model(s), some younger than minResident, "
            f"to free {deficit} bytes on {gpu.gpu} rather than wait"
        )
        return _with_victims(model, "VictimsChosenUnderMinResident", message, victims)
    busy = any(m.active_requests for m in any_resident)
    if may_wait_for_idle and busy and _total(any_resident) + leaving >= deficit:
        message = (
            f"only models serving requests could free {deficit} bytes on {gpu.gpu}; "
            f"waiting up to {settings.busy_victim_wait_seconds:g}s for one to become idle"
        )
        return _answer(model, AdmissionOutcome.WAIT, "WaitingForIdle", message)
    victims = choose(any_resident, deficit, gpu, now_seconds, settings)
    if victims is not None:
        message = (
            f"swapping out {len(victims)} model(s), some younger than minResident or busy, "
            f"to free {deficit} bytes on {gpu.gpu} rather than refuse"
        )
        return _with_victims(model, "VictimsChosenUnderMinResident", message, victims)
    arriving = _total(m for m in others if m.residency in _ARRIVING and not m.policy.pinned)
    if _total(any_resident) + leaving + arriving >= deficit:
        message = f"models on {gpu.gpu} are still loading or swapping; ask again when done"
        return _answer(model, AdmissionOutcome.WAIT, "WaitingForLoads", message)

    pinned = _total(m for m in others if m.policy.pinned and m.charged)
    message = (
        f"needs {need} bytes on GPU {gpu.gpu} (budget {gpu.budget_bytes}, "
        f"{node.used_bytes(gpu.gpu)} in use, {pinned} of them pinned); "
        "not enough can be swapped out"
    )
    return _answer(model, AdmissionOutcome.REFUSE, "NoRoom", message)


def _total(models: Iterable[ModelView]) -> int:
    return sum(m.hbm_bytes for m in models)


def _answer(model: ModelView, outcome: AdmissionOutcome, reason: str, message: str) -> Admission:
    return Admission(uid=model.uid, outcome=outcome, reason=reason, message=message)


def _with_victims(
    model: ModelView, reason: str, message: str, victims: tuple[ModelView, ...]
) -> Admission:
    return Admission(
        uid=model.uid,
        outcome=AdmissionOutcome.ADMIT,
        reason=reason,
        message=message,
        victims=tuple(
            swap_out_of(v, SwapOutReason.MAKE_ROOM, f"making room for {model.uid}") for v in victims
        ),
    )
