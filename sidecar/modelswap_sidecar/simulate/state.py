"""The simulator's mutable state of one run: each model's residency and requests, each
GPU's slots, ready queue and links. The engine owns it; policies read it to decide.

Plain classes with `__slots__`: the event loop touches them millions of times.
"""

from __future__ import annotations

from collections import deque

from modelswap_api.policy import EffectivePolicy
from modelswap_sidecar.policy.inputs import Residency

INFINITY = float("inf")


class ModelState:
    __slots__ = (
        "admission_queued",
        "admitted_at",
        "asked_at",
        "awaiting_victims",
        "cold",
        "cold_loads",
        "dependents",
        "draining",
        "gpu",
        "hbm_bytes",
        "index",
        "kv_cache_bytes",
        "last_request",
        "name",
        "pending",
        "policy",
        "queued",
        "residency",
        "resident_since",
        "running",
        "swap_ins",
        "swap_outs",
        "waiting",
        "weights_bytes",
    )

    def __init__(
        self,
        *,
        index: int,
        name: str,
        weights_bytes: int,
        kv_cache_bytes: int,
        policy: EffectivePolicy,
        gpu: GpuState,
    ) -> None:
        self.index = index
        self.name = name
        self.weights_bytes = weights_bytes
        self.kv_cache_bytes = kv_cache_bytes
        self.hbm_bytes = weights_bytes + kv_cache_bytes
        self.policy = policy
        self.gpu = gpu
        self.residency = Residency.SWAPPED_OUT
        #: True when no warm copy exists (never loaded, dropped, unloaded to cold):
        #: bringing it in is a cold load
        self.cold = True
        self.resident_since: float | None = None
        #: when its current swap-in was admitted (victims chosen)
        self.admitted_at = 0.0
        #: when the policy was first asked to bring it in since it was last resident
        self.asked_at: float | None = None
        self.last_request: float | None = None
        self.running = 0  # requests being served
        self.queued = 0  # requests in its GPU's ready queue (it is resident)
        self.pending: list[int] = []  # requests waiting for it to become resident
        self.waiting = False  # in its GPU's list of models whose admission said wait
        #: in its GPU's admission queue (serial admissions: another swap-in is under way)
        self.admission_queued = False
        self.awaiting_victims = 0  # victims still swapping out before its swap-in starts
        self.dependents: list[ModelState] = []  # swap-ins waiting for this swap-out
        self.draining = False  # swapping out, waiting for its running requests to end
        self.swap_ins = 0
        self.cold_loads = 0
        self.swap_outs = 0

    @property
    def active(self) -> int:
        return self.running + self.queued


class GpuState:
    __slots__ = (
        "admission_queue",
        "admitting",
        "budget_bytes",
        "check_at",
        "cold_free_at",
        "d2h_free_at",
        "h2d_free_at",
        "id",
        "index",
        "models",
        "over_high",
        "ready",
        "slots_free",
        "waiting",
    )

    def __init__(self, index: int, slots: int, budget_bytes: int) -> None:
        self.index = index
        self.id = f"gpu{index}"
        self.budget_bytes = budget_bytes
        self.models: list[ModelState] = []
        self.slots_free = slots
        #: heap of request indices (arrival order) of resident models, waiting for a slot
        self.ready: list[int] = []
        #: when each link is free again: host→device, device→host, cold storage
        self.h2d_free_at = 0.0
        self.d2h_free_at = 0.0
        self.cold_free_at = 0.0
        self.waiting: list[ModelState] = []
        self.check_at = INFINITY  # the earliest policy check scheduled
        self.over_high = False  # left above the high watermark by the last plan
        #: serial admissions (the agent): the model whose admission and swap-in hold the
        #: GPU's admission step, and the models asking after it, in order
        self.admitting: ModelState | None = None
        self.admission_queue: deque[ModelState] = deque()

    def used_bytes(self) -> int:
        return sum(m.hbm_bytes for m in self.models if m.residency is not Residency.SWAPPED_OUT)
