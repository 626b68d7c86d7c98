"""`attach` without an agent: anonymous memory of this process, nothing saved, nothing
swapped (see the package docstring). What the example models use: regions as bytes,
numpy arrays or torch tensors (`modelswap_client.torch` packs a module into them), a KV
pool, `in_use()`, `commit()`; `modelswap_client.triton.attach_model` (the real one) lands
here too."""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from modelswap_client.kvpool import TieredKvPool


@dataclass(frozen=True)
class RegionSpec:
    tag: str
    size_bytes: int
    kind: str = "weights"


class Region:
    # host memory the CPU may touch, as the sim backend's regions are
    on_device = False
    host_accessible = True
    device_ordinal = 0
    restored = False

    def __init__(self, spec: Any) -> None:
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

    def torch(self, dtype: str = "uint8") -> Any:
        import torch  # noqa: PLC0415 - the stub's torch, only for models that use it

        return torch.frombuffer(self.view(), dtype=torch.uint8).view(getattr(torch, dtype))

    def close(self) -> None:
        self._map.close()


class Attachment:
    # never restored: every load reads the model's files, as without modelswap
    restored = False
    dropped = False
    kv_discarded = False
    epoch = 0
    kv_generation = 0  # no swap ever discards the KV region here

    def __init__(self, model: str, regions: Sequence[Any]) -> None:
        self.model = model
        self.regions = {spec.tag: Region(spec) for spec in regions}
        self.committed = False
        self.fingerprint = ""

    def commit(self, fingerprint: str = "", *, replace: bool = False) -> None:
        self.committed = True
        self.fingerprint = fingerprint

    @contextlib.contextmanager
    def in_use(self, timeout_seconds: float | None = None) -> Iterator[None]:
        yield

    # nothing swaps here, so no hook ever runs
    def on_swap_out(self, handler: Callable[[Attachment], None]) -> None:
        pass

    def on_swap_in(self, handler: Callable[[Attachment], None]) -> None:
        pass

    def on_readopt(self, handler: Callable[[Attachment], None]) -> None:
        pass

    # no agent to report to
    def report_kv(self, report: Callable[[], dict[str, int]] | None) -> None:
        pass

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


def attach(model: str, regions: Sequence[Any], **_: Any) -> Attachment:
    return Attachment(model, regions)
