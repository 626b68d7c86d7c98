"""Regions: what a model asks for (`RegionSpec`), what it gets (`Region`, a range at a
stable address with byte, numpy, torch, cupy and CUDA views over it), and `Regions`, a
model's set of them: each range reserved once through the mapper, held until `free`."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from modelswap_api.wire import ErrorCode, RegionKind
from modelswap_client.cuda_views import DTYPES, CudaView
from modelswap_client.errors import ClientError
from modelswap_client.mappers.base import GRANULARITY_BYTES, Handle, Mapper, Reservation


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
            return torch.from_dlpack(self.cuda_view(dtype))  # type: ignore[attr-defined,unused-ignore]
        return torch.frombuffer(self.view(), dtype=torch.uint8).view(getattr(torch, dtype))

    def cupy(self, dtype: str = "uint8") -> Any:
        """A cupy array over the region's GPU memory, no copy (cupy imported only here)."""
        view = self.cuda_view(dtype)
        import cupy  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415

        return cupy.asarray(view)


def round_up(n: int) -> int:
    return -(-n // GRANULARITY_BYTES) * GRANULARITY_BYTES


class Regions:
    """A model's regions by tag, each over an address range reserved once (`reserve`) and
    kept across swaps until `free`. What is mapped in a region is in its `handles`."""

    def __init__(self, mapper: Mapper) -> None:
        self._mapper = mapper
        #: tag → region, in the order they were asked for (the public `Attachment.regions`)
        self.by_tag: dict[str, Region] = {}
        self._reservations: list[Reservation] = []

    def reserve(self, specs: Sequence[RegionSpec]) -> None:
        """Reserve each spec's range (rounded up to the granularity). What the mapper is
        (on the GPU, reachable from the CPU, which GPU) becomes each region's view rules."""
        mapper = self._mapper
        for spec in specs:
            reserved = round_up(spec.size_bytes)
            reservation = mapper.reserve(reserved)
            self._reservations.append(reservation)
            self.by_tag[spec.tag] = Region(
                spec.tag,
                RegionKind(spec.kind),
                spec.size_bytes,
                reserved,
                reservation.address,
                on_device=mapper.on_device,
                host_accessible=mapper.host_accessible,
                device_ordinal=mapper.device_ordinal,
            )

    def __getitem__(self, tag: str) -> Region:
        return self.by_tag[tag]

    def __iter__(self) -> Iterator[Region]:
        return iter(self.by_tag.values())

    def __len__(self) -> int:
        return len(self.by_tag)

    def unmap_all(self) -> None:
        """Unmap and release every mapped chunk (`synchronize()` the mapper first)."""
        for r in self.by_tag.values():
            for offset, size, h in r.handles:
                self._mapper.unmap(r.address + offset, size)
                self._mapper.release(h)
            r.handles = []

    def free(self) -> None:
        """Give every reservation back; nothing may be mapped any more."""
        for reservation in self._reservations:
            self._mapper.free_reservation(reservation)
        self._reservations = []

    def layout(self) -> list[dict[str, Any]]:
        """The regions as the attach request names them."""
        return [self._layout_of(r) for r in self.by_tag.values()]

    def export(self, *, mapped: bool) -> tuple[list[dict[str, Any]], list[int]]:
        """The regions as a readopt names them, with a new fd for every mapped chunk (the
        caller sends and closes them); `mapped` False: layouts only, no chunks."""
        fds: list[int] = []
        regions = []
        try:
            for r in self.by_tag.values():
                chunks = []
                if mapped:
                    for offset, size, h in r.handles:
                        chunks.append({"offset": offset, "bytes": size, "fd": len(fds)})
                        fds.append(self._mapper.export_fd(h))
                regions.append({**self._layout_of(r), "chunks": chunks})
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        return regions, fds

    @staticmethod
    def _layout_of(r: Region) -> dict[str, Any]:
        return {"tag": r.tag, "bytes": r.reserved_bytes, "kind": str(r.kind), "address": r.address}
