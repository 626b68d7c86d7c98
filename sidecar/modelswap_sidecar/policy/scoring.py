"""How much a model costs to bring back, and the order in which victims are taken.

Victims go lowest `priority` first; within a priority, idle models before busy ones and
busy ones by fewest requests in flight (the shortest drain, the fewest requests held back
until the model returns); then the best `bytes freed * idle seconds / seconds to restore`
first; ties by uid, so the order is total and the same inputs always give the same victims.
"""

from __future__ import annotations

from modelswap_sidecar.policy.inputs import GpuView, ModelView, PolicySettings


def restore_bytes(model: ModelView) -> int:
    """Bytes copied back on swap-in: weights, plus the KV cache when it is preserved."""
    preserved = model.kv_cache_bytes if model.policy.kv == "preserve" else 0
    return model.weights_bytes + preserved


def restore_seconds(model: ModelView, gpu: GpuView, settings: PolicySettings) -> float:
    """Estimated seconds to bring the model back after a swap-out (always > 0)."""
    if model.policy.on_swap_out == "drop":
        return (
            settings.reload_fixed_seconds
            + model.weights_bytes / settings.reload_bytes_per_second
        )  # fmt: skip
    return (
        settings.swap_in_fixed_seconds + restore_bytes(model) / gpu.host_to_device_bytes_per_second
    )


def eviction_score(
    model: ModelView, gpu: GpuView, now_seconds: float, settings: PolicySettings
) -> float:
    """bytes freed * idle seconds / restore seconds: higher is a better victim."""
    return (
        model.hbm_bytes
        * model.idle_seconds(now_seconds)
        / restore_seconds(model, gpu, settings)
    )  # fmt: skip


def victim_key(
    model: ModelView, gpu: GpuView, now_seconds: float, settings: PolicySettings
) -> tuple[int, int, float, str]:
    """Sort key: the first model in this order is the first to go."""
    return (
        model.policy.priority,
        model.active_requests,
        -eviction_score(model, gpu, now_seconds, settings),
        model.uid,
    )
