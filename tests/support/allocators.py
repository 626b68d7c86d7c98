"""`get_allocator(name, **options)`: an allocator backend by name, for tests.

The agent builds its backend itself (`agent/gpu_setup.py`, from its settings); tests name
one and pass the backend's own options. Each backend module is imported only when asked
for, so a test of the sim backend never imports the CUDA one.
"""

from __future__ import annotations

from typing import Any

from modelswap_sidecar.allocators.base import Allocator, AllocatorError


def get_allocator(name: str, /, **options: Any) -> Allocator:
    """The backend `name` ("sim" | "cuda-vmm") built with `options`; AllocatorError for
    any other name."""
    if name == "sim":
        from modelswap_sidecar.allocators.sim import SimAllocator

        return SimAllocator(**options)
    if name == "cuda-vmm":
        from modelswap_sidecar.allocators.cuda_vmm import CudaVmmAllocator

        return CudaVmmAllocator(**options)
    raise AllocatorError(f"unknown allocator backend {name!r}; known: cuda-vmm, sim")
