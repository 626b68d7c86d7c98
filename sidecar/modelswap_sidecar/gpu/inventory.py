"""The GPUs a node's agent manages (`GpuInventory`), and which allocator backend the
`allocator` setting means (`resolve_backend`: ``auto`` asks the driver through
`devices.choose_allocator_backend`: cuda-vmm when a driver and a GPU with VMM + POSIX-fd
handles are present, else sim).

The engine, the actuator and the reports index GPUs by position (0..n-1) and use that
position as the GPU's ordinal (Triton's instance groups are pinned to it). The agent's
`gpu_setup` builds the inventory with the allocator.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class NodeGpu:
    """One GPU the agent manages, at engine index `ordinal`."""

    uuid: str
    ordinal: int
    product: str
    reserve_bytes: int = 0


@dataclass(frozen=True, slots=True)
class GpuInventory:
    backend: str  # "sim" | "cuda-vmm"
    gpus: tuple[NodeGpu, ...]

    @property
    def uuids(self) -> tuple[str, ...]:
        return tuple(g.uuid for g in self.gpus)

    @property
    def mapper(self) -> str:
        """The mapper a model process uses with this allocator."""
        return self.backend

    @property
    def reserve_bytes(self) -> dict[int, int]:
        return {g.ordinal: g.reserve_bytes for g in self.gpus}


def resolve_backend(requested: str, choose: Callable[[str], str] | None = None) -> str:
    """ "sim" | "cuda-vmm" for the `allocator` setting ("auto" asks the driver)."""
    if requested != "auto":
        return requested
    if choose is None:
        from modelswap_sidecar.gpu.devices import choose_allocator_backend  # noqa: PLC0415

        choose = choose_allocator_backend
    return choose("auto")
