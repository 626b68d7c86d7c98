"""Regions: what a model asks for (`RegionSpec`) and what it gets (`Region`), a range at a
stable address with byte, numpy, torch, cupy and CUDA views over it."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Any

from modelswap_api.wire import ErrorCode, RegionKind
from modelswap_client.cuda_views import DTYPES, CudaView
from modelswap_client.errors import ClientError
from modelswap_client.mappers.base import GRANULARITY_BYTES, Handle


@dataclass(frozen=True, slots=True)
class RegionSpec:
    tag: str
    size_bytes: int
    kind: RegionKind | str = RegionKind.WEIGHTS


@dataclass(slots=True)
class Region:
    """A region at a stable address. Views are valid while the model is resident (inside
    `in_use()`): after a swap-out the addresses fault until the next swap-in."""

    tag: str
    kind: RegionKind
    size_bytes: int  # as asked for
    reserved_bytes: int  # rounded up to the 2 MiB granularity
    address: int
    restored: bool = False
    handles: list[tuple[int, int, Handle]] = field(default_factory=list)  # (offset, size, h)
    #: GPU memory (cuda-vmm, managed) rather than the sim's host memory
    on_device: bool = False
    #: the CPU may touch it (sim; managed memory is unified); cuda-vmm memory it may not
    host_accessible: bool = True
    device_ordinal: int = 0  # the GPU of on-device memory

    def view(self) -> memoryview:
        """A writable byte view of the region (memory the CPU may touch: sim, managed)."""
        if not self.host_accessible:
            raise ClientError(
                f"region {self.tag} is GPU memory: use torch() or cupy()", ErrorCode.BAD_REQUEST
            )
        buf = (ctypes.c_char * self.size_bytes).from_address(self.address)
        return memoryview(buf).cast("B")

    def numpy(self, dtype: str = "uint8") -> Any:
        """A numpy array over the region (host memory; numpy is imported only here)."""
        import numpy as np  # noqa: PLC0415 - optional, imported at use

        return np.frombuffer(self.view(), dtype=dtype)

    def cuda_view(self, dtype: str = "uint8") -> CudaView:
        """The region's GPU memory as `__cuda_array_interface__` and DLPack (no import)."""
        if not self.on_device:
            raise ClientError(
                f"region {self.tag} is host memory (sim): use numpy() or torch()",
                ErrorCode.BAD_REQUEST,
            )
        itemsize = DTYPES[dtype][2] // 8 if dtype in DTYPES else 1
        return CudaView(
            self.address,
            self.size_bytes - self.size_bytes % itemsize,
            device=self.device_ordinal,
            dtype=dtype,
            managed=self.host_accessible,
        )

    def torch(self, dtype: str = "uint8") -> Any:
        """A torch tensor over the region, no copy: on its CUDA device for GPU memory
        (DLPack, `cuda_view`), on the CPU for the sim backend (`torch.frombuffer`). torch
        is imported only here; it is not a dependency."""
        import torch  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415

        if self.on_device:
            return torch.from_dlpack(self.cuda_view(dtype))
        return torch.frombuffer(self.view(), dtype=torch.uint8).view(getattr(torch, dtype))

    def cupy(self, dtype: str = "uint8") -> Any:
        """A cupy array over the region's GPU memory, no copy (cupy imported only here)."""
        view = self.cuda_view(dtype)
        import cupy  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415

        return cupy.asarray(view)


def round_up(n: int) -> int:
    return -(-n // GRANULARITY_BYTES) * GRANULARITY_BYTES
