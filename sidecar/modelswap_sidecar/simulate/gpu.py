"""The shape of one simulated GPU: memory, links, cold loads and compute slots.

Every GPU of a run has the same shape. Bytes are bytes (the scenario's quantities say
whether a figure is GB or GiB), bandwidths bytes per second, times seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from modelswap_sidecar.simulate.errors import ScenarioError


@dataclass(frozen=True, kw_only=True)
class GpuShape:
    hbm_bytes: int
    reserve_bytes: int
    #: HBM each hosted model process keeps even while its model is swapped out (CUDA
    #: context, workspaces): DESIGN.md §4's per-process overhead.
    per_process_overhead_bytes: int
    host_store_bytes: int
    host_to_device_bytes_per_second: float
    device_to_host_bytes_per_second: float
    cold_load_bytes_per_second: float
    #: process start and framework init before a cold load's bytes move
    cold_start_seconds: float
    #: a swap-in's cost beside the copy (allocating and mapping chunks, the restore call)
    swap_in_fixed_seconds: float = 0.05
    #: a swap-out's cost beside any copy: drain, unmap, release (weights are kept clean in
    #: the host store, so a weight swap-out copies nothing)
    swap_out_fixed_seconds: float = 0.02
    #: requests one GPU serves at once (all its models together); each runs at its model's
    #: per-token time, whatever the others do
    concurrent_requests: int = 32

    def __post_init__(self) -> None:
        for name in ("hbm_bytes", "concurrent_requests"):
            if getattr(self, name) < 1:
                raise ScenarioError(f"gpu.{_camel(name)} must be at least 1")
        for name in ("reserve_bytes", "per_process_overhead_bytes", "host_store_bytes"):
            if getattr(self, name) < 0:
                raise ScenarioError(f"gpu.{_camel(name)} must be 0 or more")
        for name in (
            "host_to_device_bytes_per_second",
            "device_to_host_bytes_per_second",
            "cold_load_bytes_per_second",
        ):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ScenarioError(f"gpu.{_camel(name)} must be positive")
        for name in ("cold_start_seconds", "swap_in_fixed_seconds", "swap_out_fixed_seconds"):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise ScenarioError(f"gpu.{_camel(name)} must be 0 or more")
        if self.reserve_bytes >= self.hbm_bytes:
            raise ScenarioError("gpu.reserveBytes must be less than gpu.hbmBytes")

    def budget_bytes(self, processes: int) -> int:
        """HBM left for models on a GPU that hosts `processes` model processes."""
        return self.hbm_bytes - self.reserve_bytes - self.per_process_overhead_bytes * processes


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)
