"""`attach` without an agent: anonymous memory of this process, nothing saved, nothing
swapped (see the package docstring). Only what the example models use."""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from modelswap_client.kvpool import TieredKvPool


@dataclass(frozen=True)
class RegionSpec:
    tag: str
    size_bytes: int
    kind: str = "weights"


class Region:
    def __init__(self, spec: RegionSpec) -> None:
        self.tag = spec.tag
        self.size_bytes = spec.size_bytes
        self._map = mmap.mmap(-1, spec.size_bytes)
        anchor = ctypes.c_char.from_buffer(self._map)
        self.address = ctypes.addressof(anchor)
        del anchor  # no buffer export left open, so close() can unmap

    def view(self) -> memoryview:
        return memoryview((ctypes.c_char * self.size_bytes).from_address(self.address)).cast("B")

    def numpy(self, dtype: str = "uint8") -> Any:
        import numpy as np  # noqa: PLC0415 - the stub's numpy

        return np.frombuffer(self.view(), dtype=dtype)

    def close(self) -> None:
        self._map.close()


class Attachment:
    restored = False

    def __init__(self, regions: Sequence[RegionSpec]) -> None:
        self.regions = {spec.tag: Region(spec) for spec in regions}
        self.committed = False

    def commit(self) -> None:
        self.committed = True

    @contextlib.contextmanager
    def in_use(self) -> Iterator[None]:
        yield

    def kv_pool(self, tag: str, *, block_bytes: int, tokens_per_block: int) -> TieredKvPool:
        r = self.regions[tag]
        return TieredKvPool(
            r.address,
            r.size_bytes,
            block_bytes=block_bytes,
            tokens_per_block=tokens_per_block,
            offload_after_tokens=sys.maxsize,
            host_bytes=0,
        )

    def close(self) -> None:
        for r in self.regions.values():
            r.close()


def attach(model: str, regions: Sequence[RegionSpec], **_: Any) -> Attachment:
    return Attachment(regions)
