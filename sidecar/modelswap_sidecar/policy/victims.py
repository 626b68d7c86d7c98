"""Which resident models may be swapped out to free HBM, and the fewest that free enough."""

from __future__ import annotations

from collections.abc import Iterable

from modelswap_sidecar.policy.decisions import SwapOut, SwapOutReason
from modelswap_sidecar.policy.inputs import GpuView, ModelView, PolicySettings, Residency
from modelswap_sidecar.policy.scoring import victim_key


def evictable(model: ModelView, now_seconds: float, *, allow_young: bool) -> bool:
    """A resident, unpinned model; unless `allow_young`, also past `minResident` and with
    no request in flight (the anti-thrash rule, waived only to avoid refusing a request)."""
    if model.residency is not Residency.RESIDENT or model.policy.pinned:
        return False
    if allow_young:
        return True
    return not model.is_young(now_seconds) and model.active_requests == 0


def choose(
    candidates: Iterable[ModelView],
    deficit_bytes: int,
    gpu: GpuView,
    now_seconds: float,
    settings: PolicySettings,
    *,
    partial: bool = False,
) -> tuple[ModelView, ...] | None:
    """Victims in preference order that free at least `deficit_bytes`.

    Takes candidates in `victim_key` order until enough is freed, then gives back every
    victim (least preferred first) that turns out not to be needed. None when all of them
    together cannot free enough, unless `partial`: then all of them.
    """
    if deficit_bytes <= 0:
        return ()
    ordered = sorted(candidates, key=lambda m: victim_key(m, gpu, now_seconds, settings))
    picked: list[ModelView] = []
    freed = 0
    for model in ordered:
        if freed >= deficit_bytes:
            break
        picked.append(model)
        freed += model.hbm_bytes
    if freed < deficit_bytes:
        return tuple(picked) if partial else None
    for model in reversed(list(picked)):
        if freed - model.hbm_bytes >= deficit_bytes:
            picked.remove(model)
            freed -= model.hbm_bytes
    return tuple(picked)


def swap_out_of(model: ModelView, reason: SwapOutReason, message: str) -> SwapOut:
    return SwapOut(
        uid=model.uid,
        gpu=model.gpu,
        reason=reason,
        message=message,
        bytes_freed=model.hbm_bytes,
        drop=model.policy.on_swap_out == "drop",
    )
