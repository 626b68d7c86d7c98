"""Capacity arithmetic (DESIGN §5) and the best-fit search.

A GPU can hold a set of models when

    Σ HBM of its pinned models + HBM of its largest unpinned model
        + per-process overhead x number of models  ≤  budget (HBM total - reserved)
    Σ host bytes of its models  ≤  its host-store capacity

Unpinned models take turns in HBM (the agent swaps them), so they share one slot as large as
the largest of them; pinned models never leave, so each needs its own room; every model
process costs its overhead whether resident or not.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from modelswap_api.models import ModelSpec
from modelswap_api.policy import EffectivePolicy
from modelswap_operator.planning.eligibility import GpuSlot


@dataclass(frozen=True, kw_only=True)
class Demand:
    """What one model asks of the GPU it is placed on."""

    uid: str
    weights_bytes: int
    kv_cache_bytes: int
    preserved_kv_bytes: int  # kv_cache_bytes with `kv: preserve`, else 0
    kv_host_bytes: int  # the host KV tier (`kvCache.hostBytes`)
    pinned: bool
    priority: int
    hbm_bytes: int  # weights + KV cache
    host_bytes: int  # weights + preserved KV cache + host KV tier

    @property
    def order(self) -> tuple[bool, int, int, str]:
        """Placement order: pinned first, priority descending, larger HBM first, then UID."""
        return (not self.pinned, -self.priority, -self.hbm_bytes, self.uid)


def demand_of(uid: str, model: ModelSpec, policy: EffectivePolicy) -> Demand:
    weights_bytes = model.weights_bytes.bytes
    kv_cache_bytes = model.kv_cache_bytes.bytes if model.kv_cache_bytes else 0
    preserved_kv_bytes = kv_cache_bytes if policy.kv == "preserve" else 0
    # A model without a KV cache has no host KV tier, whatever the defaults say.
    kv_host_bytes = policy.kv_host_bytes if kv_cache_bytes else 0
    return Demand(
        uid=uid,
        weights_bytes=weights_bytes,
        kv_cache_bytes=kv_cache_bytes,
        preserved_kv_bytes=preserved_kv_bytes,
        kv_host_bytes=kv_host_bytes,
        pinned=policy.pinned,
        priority=policy.priority,
        hbm_bytes=weights_bytes + kv_cache_bytes,
        # Weights count even with `onSwapOut: drop`, where the agent keeps no weight copy in
        # the host store: conservative on purpose, so that switching a model to `host`
        # never needs a move, and a dropped model's reload still needs host memory.
        host_bytes=weights_bytes + preserved_kv_bytes + kv_host_bytes,
    )


class Ledger:
    """What the plan has put on each GPU so far. Mutable, local to one `plan` call."""

    def __init__(self, slots: Sequence[GpuSlot]) -> None:
        self.slots = tuple(slots)
        self._budget_bytes = [s.budget_bytes for s in self.slots]
        self._overhead_bytes = [s.overhead_bytes for s in self.slots]
        self._host_capacity_bytes = [s.host_capacity_bytes for s in self.slots]
        count = len(self.slots)
        self.pinned_bytes = [0] * count
        self.largest_unpinned_bytes = [0] * count
        self.models = [0] * count
        self.host_bytes = [0] * count

    def free_hbm_bytes(self, index: int) -> int:
        committed = (
            self.pinned_bytes[index]
            + self.largest_unpinned_bytes[index]
            + self._overhead_bytes[index] * self.models[index]
        )
        return self._budget_bytes[index] - committed

    def free_host_bytes(self, index: int) -> int:
        return self._host_capacity_bytes[index] - self.host_bytes[index]

    def room_after(self, index: int, demand: Demand) -> tuple[int, int] | None:
        """(free HBM, free host store) left on the GPU with `demand` added; None: no fit."""
        host = self._host_capacity_bytes[index] - self.host_bytes[index] - demand.host_bytes
        if host < 0:
            return None
        pinned = self.pinned_bytes[index]
        largest = self.largest_unpinned_bytes[index]
        if demand.pinned:
            pinned += demand.hbm_bytes
        elif demand.hbm_bytes > largest:
            largest = demand.hbm_bytes
        overheads = self._overhead_bytes[index] * (self.models[index] + 1)
        hbm = self._budget_bytes[index] - pinned - largest - overheads
        if hbm < 0:
            return None
        return hbm, host

    def add(self, index: int, demand: Demand) -> None:
        if demand.pinned:
            self.pinned_bytes[index] += demand.hbm_bytes
        else:
            self.largest_unpinned_bytes[index] = max(
                self.largest_unpinned_bytes[index], demand.hbm_bytes
            )
        self.models[index] += 1
        self.host_bytes[index] += demand.host_bytes


class BestFit:
    """Best fit: the GPU that fits the model with the least free HBM left, then the least
    free host store left, then the first by (node name, GPU UUID).

    Why best fit: modelswap exists to pack models onto few GPUs, and what a later large or
    pinned model needs is a GPU with a lot of free HBM; best fit fills partly used GPUs first
    and keeps such GPUs whole, where spreading would leave every GPU a little too full.
    Contention between models on one GPU is the agent's to manage (swapping).

    The search never looks at every GPU for every model: empty GPUs with the same capacity
    (`GpuSlot.hardware`) score alike, so only the first such GPU of each kind is tried; used
    GPUs are tried only while "open", and one is closed (for the rest of the call) once it
    cannot take even the smallest model still to come.
    """

    def __init__(self, ledger: Ledger, groups: Mapping[object, Sequence[GpuSlot]]) -> None:
        self._ledger = ledger
        count = len(ledger.slots)
        self._used = [False] * count
        self._groups_of: list[list[object]] = [[] for _ in range(count)]
        self._open: dict[object, set[int]] = {}
        self._empty: dict[object, list[deque[int]]] = {}
        for key, gpus in groups.items():
            self._open[key] = set()
            by_hardware: dict[tuple[int, int, int], deque[int]] = {}
            for gpu in gpus:  # in slot order
                by_hardware.setdefault(gpu.hardware, deque()).append(gpu.index)
                self._groups_of[gpu.index].append(key)
            self._empty[key] = list(by_hardware.values())

    def used(self, indices: Iterable[int], floor_host_bytes: int) -> None:
        """Mark GPUs that already hold models (kept ones) as used."""
        for index in indices:
            self._use(index, floor_host_bytes)

    def best(self, key: object, demand: Demand, floor_host_bytes: int) -> int | None:
        """The slot index to place `demand` on, or None when no eligible GPU has room."""
        best: tuple[int, int, int] | None = None
        full: list[int] = []
        for index in self._open[key]:
            room = self._ledger.room_after(index, demand)
            if room is None:
                if self._is_full(index, floor_host_bytes):
                    full.append(index)
            elif best is None or (*room, index) < best:
                best = (*room, index)
        for queue in self._empty[key]:
            while queue and self._used[queue[0]]:
                queue.popleft()
            if queue:
                room = self._ledger.room_after(queue[0], demand)
                if room is not None and (best is None or (*room, queue[0]) < best):
                    best = (*room, queue[0])
        for index in full:
            self._close(index)
        return None if best is None else best[2]

    def add(self, index: int, demand: Demand, floor_host_bytes: int) -> None:
        """Put `demand` on the GPU; `floor_host_bytes`: the smallest host bytes to come."""
        self._ledger.add(index, demand)
        self._use(index, floor_host_bytes)

    def _use(self, index: int, floor_host_bytes: int) -> None:
        if not self._used[index]:
            self._used[index] = True
            for key in self._groups_of[index]:
                self._open[key].add(index)
        if self._is_full(index, floor_host_bytes):
            self._close(index)

    def _is_full(self, index: int, floor_host_bytes: int) -> bool:
        """No model still to come can fit: each adds at least the per-process overhead."""
        ledger = self._ledger
        return (
            ledger.free_hbm_bytes(index) < ledger.slots[index].overhead_bytes
            or ledger.free_host_bytes(index) < floor_host_bytes
        )

    def _close(self, index: int) -> None:
        for key in self._groups_of[index]:
            self._open[key].discard(index)
