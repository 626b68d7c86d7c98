"""What the policy reads: a frozen snapshot of one node's GPUs and models.

Times are seconds on one clock the caller chooses and passes in as `now_seconds`
(the agent: `time.monotonic()`; the simulator: trace time). Nothing here reads a clock.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from modelswap_api.policy import EffectivePolicy
from modelswap_sidecar.policy.errors import PolicyInputError


class Residency(enum.StrEnum):
    """Where a model's bytes are, as far as the HBM budget is concerned."""

    RESIDENT = "resident"  # holds HBM; may be swapped out
    SWAPPED_OUT = "swapped_out"  # holds no HBM (weights in the host store, or dropped)
    LOADING = "loading"  # charged to HBM; becomes resident
    SWAPPING_IN = "swapping_in"  # charged to HBM; becomes resident
    SWAPPING_OUT = "swapping_out"  # still charged to HBM; frees it when done


#: Residencies whose bytes count against the GPU's budget.
CHARGED = frozenset(
    {Residency.RESIDENT, Residency.LOADING, Residency.SWAPPING_IN, Residency.SWAPPING_OUT}
)


@dataclass(frozen=True, kw_only=True)
class ModelView:
    """One model on one GPU."""

    uid: str
    gpu: str
    weights_bytes: int
    kv_cache_bytes: int = 0
    residency: Residency
    policy: EffectivePolicy
    #: When the model last became resident (required while RESIDENT or SWAPPING_OUT).
    resident_since_seconds: float | None = None
    last_request_seconds: float | None = None
    active_requests: int = 0

    def __post_init__(self) -> None:
        if self.weights_bytes < 1 or self.kv_cache_bytes < 0:
            raise PolicyInputError(f"{self.uid}: sizes must be positive")
        if self.active_requests < 0:
            raise PolicyInputError(f"{self.uid}: active_requests must be 0 or more")
        needs_since = self.residency in (Residency.RESIDENT, Residency.SWAPPING_OUT)
        if needs_since and self.resident_since_seconds is None:
            raise PolicyInputError(f"{self.uid}: a {self.residency} model needs resident_since")

    @property
    def hbm_bytes(self) -> int:
        """Bytes the model holds on its GPU while resident: weights and KV cache."""
        return self.weights_bytes + self.kv_cache_bytes

    @property
    def charged(self) -> bool:
        return self.residency in CHARGED

    def idle_seconds(self, now_seconds: float) -> float:
        """Seconds since the last request or since it became resident, whichever is later;
        0 while requests are in flight."""
        if self.active_requests > 0:
            return 0.0
        marks = [
            t for t in (self.last_request_seconds, self.resident_since_seconds) if t is not None
        ]
        if not marks:
            return 0.0
        return max(now_seconds - max(marks), 0.0)

    def resident_seconds(self, now_seconds: float) -> float:
        if self.resident_since_seconds is None:
            return 0.0
        return max(now_seconds - self.resident_since_seconds, 0.0)

    def is_young(self, now_seconds: float) -> bool:
        """Resident for less than `minResident` (the anti-thrash window)."""
        min_resident = self.policy.min_resident.seconds or 0.0
        return self.resident_seconds(now_seconds) < min_resident


@dataclass(frozen=True, kw_only=True)
class GpuView:
    """One GPU's budget (total - reserve - per-process overheads) and its link."""

    gpu: str
    budget_bytes: int
    host_to_device_bytes_per_second: float

    def __post_init__(self) -> None:
        if self.budget_bytes < 0:
            raise PolicyInputError(f"GPU {self.gpu}: budget_bytes must be 0 or more")
        if not self.host_to_device_bytes_per_second > 0:
            raise PolicyInputError(f"GPU {self.gpu}: link bandwidth must be positive")


@dataclass(frozen=True, kw_only=True)
class PolicySettings:
    """Node-wide knobs (agent settings), not per-model policy.

    Above `high_watermark_fraction` of a GPU's budget, idle-enough models are swapped out
    until use is at or below `low_watermark_fraction`. Restoring a host-kept model costs
    `swap_in_fixed_seconds` plus its bytes over the GPU's link; a dropped one costs
    `reload_fixed_seconds` plus its weights at `reload_bytes_per_second` (the source cache).

    When only models serving requests could make room, admission waits up to
    `busy_victim_wait_seconds` (from the first ask) for one of them to become idle before
    it drains a busy one: a model's requests usually end sooner than a chosen victim's
    drain, and waiting holds none of the victim's own requests back.
    """

    high_watermark_fraction: float = 0.95
    low_watermark_fraction: float = 0.85
    swap_in_fixed_seconds: float = 0.05
    reload_bytes_per_second: float = 1e9
    reload_fixed_seconds: float = 2.0
    busy_victim_wait_seconds: float = 10.0

    def __post_init__(self) -> None:
        low, high = self.low_watermark_fraction, self.high_watermark_fraction
        if not 0 < low <= high <= 1:
            raise PolicyInputError(f"watermarks must satisfy 0 < low ({low}) <= high ({high}) <= 1")
        for name in ("swap_in_fixed_seconds", "reload_fixed_seconds"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise PolicyInputError(f"{name} must be positive")
        if not self.reload_bytes_per_second > 0:
            raise PolicyInputError("reload_bytes_per_second must be positive")
        wait = self.busy_victim_wait_seconds
        if not (wait >= 0 and math.isfinite(wait)):
            raise PolicyInputError("busy_victim_wait_seconds must be 0 or more")


@dataclass(frozen=True, kw_only=True)
class NodeView:
    """Everything the policy decides from. Models and GPUs are keyed by uid and id."""

    gpus: tuple[GpuView, ...]
    models: tuple[ModelView, ...]

    def __post_init__(self) -> None:
        gpu_ids = [g.gpu for g in self.gpus]
        if len(set(gpu_ids)) != len(gpu_ids):
            raise PolicyInputError("duplicate GPU ids")
        uids = [m.uid for m in self.models]
        if len(set(uids)) != len(uids):
            raise PolicyInputError("duplicate model uids")
        unknown = sorted({m.gpu for m in self.models} - set(gpu_ids))
        if unknown:
            raise PolicyInputError(f"models on unknown GPUs: {', '.join(unknown)}")

    def gpu(self, gpu: str) -> GpuView:
        for view in self.gpus:
            if view.gpu == gpu:
                return view
        raise PolicyInputError(f"unknown GPU {gpu}")

    def model(self, uid: str) -> ModelView:
        for view in self.models:
            if view.uid == uid:
                return view
        raise PolicyInputError(f"unknown model {uid}")

    def models_on(self, gpu: str) -> tuple[ModelView, ...]:
        return tuple(m for m in self.models if m.gpu == gpu)

    def used_bytes(self, gpu: str) -> int:
        """Bytes charged to `gpu`: every model that holds or is being given HBM."""
        return sum(m.hbm_bytes for m in self.models_on(gpu) if m.charged)

    def leaving_bytes(self, gpu: str) -> int:
        """Bytes being swapped out on `gpu` now: free once those swaps finish."""
        return sum(
            m.hbm_bytes for m in self.models_on(gpu) if m.residency is Residency.SWAPPING_OUT
        )
