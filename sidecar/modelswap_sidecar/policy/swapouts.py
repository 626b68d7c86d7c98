"""Swap-outs to start now: models idle past `idleAfter`, then relief above the high watermark.

    plan_swap_outs(node, now_seconds, settings) -> tuple[SwapOut, ...]

Neither rule ever touches a pinned model, a model younger than `minResident`, one with
requests in flight, or one that is not plainly resident (loading or mid-swap).
"""

from __future__ import annotations

import math

from modelswap_sidecar.policy.decisions import SwapOut, SwapOutReason
from modelswap_sidecar.policy.inputs import ModelView, NodeView, PolicySettings, Residency
from modelswap_sidecar.policy.victims import choose, evictable, swap_out_of


def plan_swap_outs(
    node: NodeView, now_seconds: float, settings: PolicySettings
) -> tuple[SwapOut, ...]:
    """Idle swap-outs (by uid), then per GPU (by id) the pressure victims still needed."""
    idle = idle_swap_outs(node, now_seconds)
    leaving = {s.uid for s in idle}
    pressure: list[SwapOut] = []
    for gpu in sorted(node.gpus, key=lambda g: g.gpu):
        pressure.extend(pressure_swap_outs(node, gpu.gpu, now_seconds, settings, leaving))
    return (*idle, *pressure)


def is_idle(model: ModelView, now_seconds: float) -> bool:
    """Resident, unpinned, idle for at least `idleAfter` (never, for `idleAfter: never`)
    and resident for at least `minResident`."""
    idle_after = model.policy.idle_after.seconds
    if idle_after is None or not evictable(model, now_seconds, allow_young=False):
        return False
    return model.idle_seconds(now_seconds) >= idle_after


def idle_swap_outs(node: NodeView, now_seconds: float) -> tuple[SwapOut, ...]:
    found = []
    for model in sorted(node.models, key=lambda m: m.uid):
        if is_idle(model, now_seconds):
            message = (
                f"idle for {model.idle_seconds(now_seconds):.0f}s "
                f"(idleAfter {model.policy.idle_after.raw})"
            )
            found.append(swap_out_of(model, SwapOutReason.IDLE, message))
    return tuple(found)


def pressure_swap_outs(
    node: NodeView,
    gpu_id: str,
    now_seconds: float,
    settings: PolicySettings,
    leaving: frozenset[str] | set[str] = frozenset(),
) -> tuple[SwapOut, ...]:
    """Above the high watermark, victims until use is at or below the low watermark.

    Bytes already on their way out (swaps in progress, and the `leaving` uids) count as
    freed. When the evictable models cannot reach the low watermark, all of them go.
    """
    gpu = node.gpu(gpu_id)
    models = node.models_on(gpu_id)
    already_leaving = sum(
        m.hbm_bytes
        for m in models
        if m.residency is Residency.SWAPPING_OUT or (m.uid in leaving and m.charged)
    )
    used = node.used_bytes(gpu_id) - already_leaving
    high = math.floor(gpu.budget_bytes * settings.high_watermark_fraction)
    low = math.floor(gpu.budget_bytes * settings.low_watermark_fraction)
    if used <= high:
        return ()
    candidates = [
        m for m in models if m.uid not in leaving and evictable(m, now_seconds, allow_young=False)
    ]
    victims = choose(candidates, used - low, gpu, now_seconds, settings, partial=True) or ()
    message = (
        f"GPU {gpu_id} uses {used} of {gpu.budget_bytes} bytes, above its high watermark "
        f"({settings.high_watermark_fraction:g}); freeing down to "
        f"{settings.low_watermark_fraction:g}"
    )
    return tuple(swap_out_of(m, SwapOutReason.PRESSURE, message) for m in victims)
